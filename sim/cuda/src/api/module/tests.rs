//! Module images: what the simulator reads from them (api/module.rs).

use super::*;

#[test]
fn simulator_images_declare_memory_and_kernels() {
    let i = parse_image_text("fgpu-sim-module 4M\nkernel spin 1us\n# comment\nkernel long 2ms\n").unwrap();
    assert_eq!(i.bytes, 4 << 20);
    assert_eq!(i.kernels, vec![("spin".to_string(), 1000), ("long".to_string(), 2_000_000)]);
    let i = parse_image_text("fgpu-sim-module; kernel k 50us").unwrap();
    assert_eq!(i.bytes, MODULE_DEFAULT_BYTES);
    assert_eq!(i.kernels, vec![("k".to_string(), 50_000)]);
    for bad in [
        "fgpu-sim-module 4 parsecs",
        "fgpu-sim-module\nkernel spin",
        "fgpu-sim-module\nkernel spin 2",
        "fgpu-sim-module\nkernel a 1us\nkernel a 2us",
        "fgpu-sim-module\nfunction spin 1us",
    ] {
        assert!(parse_image_text(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn other_images_take_the_default_and_declare_nothing() {
    let elf = b"\x7fELF\x02\x01\x01\0\0\0";
    let i = read_image(elf.as_ptr() as *const c_void).unwrap();
    assert_eq!((i.bytes, i.kernels.len()), (MODULE_DEFAULT_BYTES, 0));
    let i = read_image(c"fgpu-sim-module 8M\nkernel x 3ms".as_ptr() as *const c_void).unwrap();
    assert_eq!((i.bytes, i.kernels.len()), (8 << 20, 1));
}
