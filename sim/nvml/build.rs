fn main() {
    // The simulated NVML is loaded as libnvidia-ml.so.1, like the real one.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
