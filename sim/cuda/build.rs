fn main() {
    // The simulated driver is loaded as libcuda.so.1, like the real one.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
