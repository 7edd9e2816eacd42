//! The workspace's `uniffi-bindgen`, pinned to the library's uniffi version so generated bindings
//! always match the scaffolding compiled into `libcc_app_server_ffi`.

fn main() {
    uniffi::uniffi_bindgen_main()
}
