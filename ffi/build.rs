//! Generates the C header from the C ABI, `src/capi/` (`mod.rs` and the per-handle modules it
//! declares, which cbindgen follows in declaration order), with cbindgen into OUT_DIR on every
//! build; the crate's tests compare it with the checked-in `include/cc_app_server.h`, so a stale
//! header fails `cargo test`. `CC_FFI_UPDATE_HEADER=1` also writes the checked-in copy.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    // A directory: cargo reruns when any file under it changes.
    println!("cargo:rerun-if-changed=src/capi");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=CC_FFI_UPDATE_HEADER");
    let config =
        cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    // One source, the module root: cbindgen parses `mod x;` declarations from it (src/capi/x.rs),
    // each after the items of the file that declares it. The header's order is that order.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/capi/mod.rs"))
        .generate()
        .expect("cbindgen can read src/capi");
    bindings.write_to_file(out.join("cc_app_server.h"));
    if std::env::var_os("CC_FFI_UPDATE_HEADER").is_some_and(|v| v == "1") {
        bindings.write_to_file(dir.join("include/cc_app_server.h"));
    }
}
