//! How layer blobs are compressed, as recipes name it and manifests record it. The block
//! sizes and levels are part of the format: the compressors in `imgbuild_oci::layers::compress`
//! follow them, and changing one changes every digest. [`bounded`] reads what strangers
//! compressed with a bound on what comes out.

pub mod bounded;

/// Input block size of the gzip compressor. Part of the format: changing it changes every
/// digest.
pub const GZIP_BLOCK: usize = 1 << 20;
/// Input block size of the zstd compressor; part of the format too.
pub const ZSTD_BLOCK: usize = 4 << 20;
/// gzip level (libdeflate's scale matches zlib's: 6 is the default of gzip and pigz).
pub const GZIP_LEVEL: i32 = 6;
/// zstd level: 3, zstd's default, 8–9 % smaller than gzip-6 at 3–4× its speed.
pub const ZSTD_LEVEL: i32 = 3;

/// The layouts of layers a node can read file by file (`imgbuild_oci::layers::seekable` writes
/// them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekableFormat {
    Estargz,
    ZstdChunked,
}

/// The compressor of layer blobs. Recorded in an annotation; changing it changes every
/// digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Compression {
    /// Multi-member gzip of 1 MiB blocks, libdeflate level 6.
    #[default]
    Gzip,
    /// zstd level 3, one frame per 4 MiB block.
    Zstd,
    /// eStargz: gzip (libdeflate level 6) with a member per file and per 4 MiB chunk, a TOC
    /// and a footer, so the stargz snapshotter can pull files lazily; a plain `tar+gzip`
    /// layer to every other reader (`imgbuild_oci::layers::seekable`).
    Estargz,
    /// zstd:chunked: zstd level 3 with frames per file and per 4 MiB chunk, a TOC in a
    /// skippable frame and a footer, so containers/storage (1.43) can pull files partially;
    /// a plain `tar+zstd` layer to every other reader.
    ZstdChunked,
}

impl Compression {
    pub fn media_type(&self) -> &'static str {
        match self {
            Compression::Gzip | Compression::Estargz => {
                "application/vnd.oci.image.layer.v1.tar+gzip"
            }
            Compression::Zstd | Compression::ZstdChunked => {
                "application/vnd.oci.image.layer.v1.tar+zstd"
            }
        }
    }

    /// The annotation value naming compressor, backend and settings; also part of every
    /// layer cache key.
    pub fn describe(&self) -> String {
        match self {
            Compression::Gzip => {
                format!("gzip;level={GZIP_LEVEL};backend=libdeflate-1.x;block=1MiB;members")
            }
            Compression::Zstd => {
                format!("zstd;level={ZSTD_LEVEL};backend=libzstd-1.5;block=4MiB;frames")
            }
            Compression::Estargz => format!(
                "estargz;gzip;level={GZIP_LEVEL};backend=libdeflate-1.x;chunk=4MiB;toc;footer=51"
            ),
            Compression::ZstdChunked => format!(
                "zstd:chunked;level={ZSTD_LEVEL};backend=libzstd-1.5;chunk=4MiB;toc;footer=40"
            ),
        }
    }

    /// The layout of a layer made to be read file by file, if it is one.
    pub fn seekable(&self) -> Option<SeekableFormat> {
        match self {
            Compression::Estargz => Some(SeekableFormat::Estargz),
            Compression::ZstdChunked => Some(SeekableFormat::ZstdChunked),
            Compression::Gzip | Compression::Zstd => None,
        }
    }

    /// The recipe's name for it.
    pub fn name(&self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
            Compression::Estargz => "estargz",
            Compression::ZstdChunked => "zstd:chunked",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "gzip" => Some(Compression::Gzip),
            "zstd" => Some(Compression::Zstd),
            "estargz" => Some(Compression::Estargz),
            "zstd:chunked" => Some(Compression::ZstdChunked),
            _ => None,
        }
    }
}
