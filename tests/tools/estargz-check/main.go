// estargz-check reads an eStargz layer blob with the stargz snapshotter's own estargz
// package (Debian's golang-github-containerd-stargz-snapshotter-dev), the code the snapshotter
// runs on a node, and checks it the way a lazy pull would use it:
//
//   - the footer and the TOC open (estargz.Open), and the TOC matches the digest given
//     (VerifyTOC, with the layer annotation's value);
//   - every regular file read through the TOC (each chunk fetched from its own offset)
//     has the bytes the plain gzip stream holds for it, and each chunk matches its digest.
//
// Usage: estargz-check BLOB TOC_DIGEST. Prints one JSON line of counts; exits 1 on any
// mismatch, naming it.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/containerd/stargz-snapshotter/estargz"
	digest "github.com/opencontainers/go-digest"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "estargz-check: "+format+"\n", args...)
	os.Exit(1)
}

// plainFiles reads the blob as any runtime does: one gzip stream, one tar.
func plainFiles(blob []byte) map[string][]byte {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		fail("not gzip: %v", err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			fail("not a tar: %v", err)
		}
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				fail("reading %s: %v", h.Name, err)
			}
			files[h.Name] = data
		}
	}
	return files
}

func main() {
	if len(os.Args) != 3 {
		fail("usage: estargz-check BLOB TOC_DIGEST")
	}
	blob, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail("%v", err)
	}
	tocDigest, err := digest.Parse(os.Args[2])
	if err != nil {
		fail("bad TOC digest: %v", err)
	}
	r, err := estargz.Open(io.NewSectionReader(bytes.NewReader(blob), 0, int64(len(blob))))
	if err != nil {
		fail("open: %v", err)
	}
	verifier, err := r.VerifyTOC(tocDigest)
	if err != nil {
		fail("VerifyTOC: %v", err)
	}
	plain := plainFiles(blob)
	files, chunks, bytesRead := 0, 0, 0
	for name, want := range plain {
		if name == estargz.TOCTarName {
			continue
		}
		entry, ok := r.Lookup(name)
		if !ok {
			fail("%s is in the tar but not in the TOC", name)
		}
		sr, err := r.OpenFile(name)
		if err != nil {
			fail("OpenFile %s: %v", name, err)
		}
		got, err := io.ReadAll(io.NewSectionReader(sr, 0, sr.Size()))
		if err != nil {
			fail("reading %s through the TOC: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			fail("%s: %d bytes through the TOC differ from the %d in the tar", name, len(got), len(want))
		}
		if entry.Digest != "" && entry.Digest != digest.FromBytes(want).String() {
			fail("%s: TOC digest %s is not the file's", name, entry.Digest)
		}
		// Each chunk, as the snapshotter fetches and checks it.
		for off := int64(0); off < int64(len(want)); {
			ce, ok := r.ChunkEntryForOffset(name, off)
			if !ok {
				fail("%s: no chunk at %d", name, off)
			}
			v, err := verifier.Verifier(ce)
			if err != nil {
				fail("%s: chunk at %d: %v", name, off, err)
			}
			end := ce.ChunkOffset + ce.ChunkSize
			v.Write(want[ce.ChunkOffset:end])
			if !v.Verified() {
				fail("%s: chunk at %d does not match its digest", name, off)
			}
			chunks++
			off = end
		}
		files++
		bytesRead += len(got)
	}
	sum := sha256.Sum256(blob)
	out, _ := json.Marshal(map[string]interface{}{
		"blob": fmt.Sprintf("sha256:%x", sum), "files": files, "chunks": chunks, "bytes": bytesRead,
	})
	fmt.Println(string(out))
}
