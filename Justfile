# imgbuild tasks. `cargo install just` if you do not have it; every recipe is also a plain
# command you can copy.

export CARGO_TARGET_DIR := env_var_or_default("CARGO_TARGET_DIR", "target")

# Build the release binary
build:
    cargo build --release

# The in-image smoke executables (`[smoke] embed = true`) for x86-64 and aarch64, linked against
# glibc 2.17 so they run in any glibc image: zig and cargo-zigbuild from PyPI
# (tests/install-deps.sh puts them in the test venv; `rustup target add
# aarch64-unknown-linux-gnu`). Writes target/{x86_64,aarch64}-unknown-linux-gnu/release/
# imgbuild-smoke; pass both to builds (--smoke-exe A --smoke-exe B, or IMGBUILD_SMOKE_EXE=A:B).
smoke-exe:
    PATH="${IMGBUILD_TEST_CACHE:-tests/.cache}/venv/bin:$PATH" cargo zigbuild --release --locked -p imgbuild-smoke --target x86_64-unknown-linux-gnu.2.17
    PATH="${IMGBUILD_TEST_CACHE:-tests/.cache}/venv/bin:$PATH" cargo zigbuild --release --locked -p imgbuild-smoke --target aarch64-unknown-linux-gnu.2.17

# imgbuild's own image (recipes/imgbuild-builder.toml), which `imgbuild k8s --build-job` pods
# run: imgbuild and imgbuild-smoke for glibc 2.17, packaged as a conda package in
# images/.builder-channel, then built on distroless (needs gcr.io reachable; or change `base`).
builder:
    just smoke-exe
    PATH="${IMGBUILD_TEST_CACHE:-tests/.cache}/venv/bin:$PATH" cargo zigbuild --release --locked --bin imgbuild --target x86_64-unknown-linux-gnu.2.17
    cargo run --quiet --example make_builder_channel -- images/.builder-channel $CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/imgbuild $CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/imgbuild-smoke
    $CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/imgbuild build recipes/imgbuild-builder.toml

# Install the test tools (Debian/Ubuntu, as root) and run every test
test:
    tests/install-deps.sh
    cargo test --all-targets

# The book (docs/), served at http://localhost:3000 as you edit; `mdbook build docs` writes
# it to docs/book/. mdBook comes from the test venv (tests/install-deps.sh).
book:
    "${IMGBUILD_TEST_CACHE:-tests/.cache}/venv/bin/mdbook" serve docs

# rustfmt and clippy, as CI runs them
lint:
    cargo fmt --check
    cargo clippy --all-targets -- -D warnings

# Offline demo: make a local channel and busybox base, build recipes/demo.toml, run it under runc
demo:
    cargo run --quiet --example make_demo_channel -- images/.demo
    cargo run --quiet -- build recipes/demo.toml
    rm -rf images/.demo/bundle
    umoci unpack --image images/demo:latest images/.demo/bundle
    # runc without a terminal: the demo runs in scripts and CI logs too
    sed -i 's/"terminal":true/"terminal":false/; s/"terminal": true/"terminal": false/' images/.demo/bundle/config.json
    runc run --bundle images/.demo/bundle imgbuild-demo-$$ < /dev/null

# Benchmark: a 2.65 GB torch + CUDA environment made from pinned PyPI wheels, built cold, warm,
# as a no-op and after one small change, and pushed unchanged; against tar|gzip -6, tar|pigz,
# tar|zstd -3, umoci repack and imgbuild's own compressor on the same bytes in memory. Replaces
# this checkout's section of docs/benchmarks.md; also a node (podman pulls, partial pulls off and
# on; containerd full and lazy with the stargz snapshotter) and a 3x environment. Needs root and:
# apt-get install pigz zstd umoci docker-registry time podman busybox-static (the containerd rows
# also what tests/install-deps.sh installs). Pass e.g. `--imgbuild OLD_BINARY --label before` to
# measure another build. `just bench --trust-against OLD_BINARY` measures only what the trust
# checks cost (cold, warm, cache-hit, restored-cache, one-package and `[[files]]` builds,
# taking turns with OLD; a few minutes once the channel is made).
# `just bench --synthetic [--jobs 2,4,8,16,64] [--size-gb N] [--seed S]` needs no network nor
# tools: a deterministic ~2.6 GB, 20-package environment from a seeded PRNG (incompressible,
# text-like and binary-like bytes) as a local channel, then a warm zstd and gzip build per -j,
# each pinned to that many CPUs: wall time, peak RSS, speedup and wall ÷ CPU floor (issue 32).
# `just bench --fleet [--size-gb N] [--no-buildah]`: fresh builders of that environment through
# a local docker-registry as `--cache-repo` (cold, no change, one package changed), beside
# buildah's --cache-to/--cache-from; time, bytes extracted, compressed and moved (issue 28); then
# a 4-variant matrix built by 1, 2 and 4 `--shard` workers and assembled from the registry,
# against one plain matrix build: time, peak RSS, bytes compressed ÷ distinct layer bytes.
bench *ARGS:
    cargo build --release --bin imgbuild --example bench
    cargo run --release --quiet --example bench -- --out docs/benchmarks.md {{ARGS}}
