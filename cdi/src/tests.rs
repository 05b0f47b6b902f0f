//! The CDI specs' unit tests: plans, combinations, configuration text and specs.

use super::*;

const U0: &str = "GPU-7f2f4a87-663d-b312-36f4-6ad9417f4505";
const U1: &str = "GPU-11111111-2222-3333-4444-555555555555";

fn gpus() -> Vec<Gpu> {
    vec![Gpu { index: 0, uuid: U0.into(), total: 80 * GIB }, Gpu { index: 1, uuid: U1.into(), total: 24 * GIB }]
}

fn names(devices: &[Device]) -> Vec<&str> {
    devices.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn names_cover_each_gpu_size_and_percentage_that_fits() {
    let devices = plan(&gpus(), &[8 * GIB, 40 * GIB, 1536 * MIB], &[25], &[]).unwrap();
    assert_eq!(names(&devices), ["0-8g", "0-40g", "0-1536m", "0-25pct", "1-8g", "1-1536m", "1-25pct", "all-8g", "all-1536m", "all-25pct"]);
}

#[test]
fn device_names_are_valid_cdi_names() {
    // CDI: letters, digits, '_', '-', '.', ':'; starts and ends with a letter or digit.
    let devices = plan(&gpus(), &[2 * GIB, 1536 * MIB], &[10, 100], &["0-8g,1-4g".into()]).unwrap();
    for name in names(&devices) {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c);
        assert!(name.chars().all(ok_char), "{name}");
        assert!(name.starts_with(|c: char| c.is_ascii_alphanumeric()) && name.ends_with(|c: char| c.is_ascii_alphanumeric()), "{name}");
    }
}

#[test]
fn config_of_one_gpu_caps_it_by_uuid_and_leaves_nothing_on_others() {
    let devices = plan(&gpus(), &[8 * GIB], &[25], &[]).unwrap();
    let text = config_text(&devices[0], &gpus());
    assert!(text.starts_with(HEADER), "{text}");
    assert!(text.contains(&format!("\nlimit = {U0}=8G,*=1\n")), "{text}");
    assert!(text.contains("\nledger = /run/fgpu/ledger\n"), "{text}");
    // The file must parse as fgpu.conf does, and give 8 GiB on GPU 0 and 1 byte elsewhere.
    let limit = text.lines().find_map(|l| l.strip_prefix("limit = ")).unwrap();
    let spec = fgpu_core::limit::parse_limit(limit).unwrap();
    assert_eq!(spec.cap_for(U0, 80 * GIB), Some(8 * GIB));
    assert_eq!(spec.cap_for(U1, 24 * GIB), Some(1));
    let pct = devices.iter().find(|d| d.name == "1-25pct").unwrap();
    let limit = config_text(pct, &gpus()).lines().find_map(|l| l.strip_prefix("limit = ").map(str::to_string)).unwrap();
    assert_eq!(fgpu_core::limit::parse_limit(&limit).unwrap().cap_for(U1, 24 * GIB), Some(6 * GIB));
}

#[test]
fn config_of_all_caps_every_gpu() {
    let devices = plan(&gpus(), &[8 * GIB], &[], &[]).unwrap();
    let all = devices.iter().find(|d| d.name == "all-8g").unwrap();
    let text = config_text(all, &gpus());
    assert!(text.contains("\nlimit = 8G\n"), "{text}");
    assert!(!text.contains("*=1"), "{text}");
}

#[test]
fn combinations_cap_several_gpus_in_one_file() {
    let devices = plan(&gpus(), &[8 * GIB], &[], &["1-4g,0-8g".into(), "0-50pct_1-2g".into()]).unwrap();
    let combo = devices.iter().find(|d| d.name == "0-8g_1-4g").expect("sorted by GPU index");
    let text = config_text(combo, &gpus());
    assert!(text.contains(&format!("\nlimit = {U0}=8G,{U1}=4G,*=1\n")), "{text}");
    assert!(devices.iter().any(|d| d.name == "0-50pct_1-2g"));
}

#[test]
fn bad_combinations_say_what_is_wrong() {
    let err = |c: &str| plan(&gpus(), &[8 * GIB], &[], &[c.to_string()]).unwrap_err().to_string();
    assert_eq!(err("0-8g"), r#"--combine "0-8g": a combination needs two or more GPUs, such as 0-8g,1-4g"#);
    assert!(err("0-8g").contains("two or more GPUs"), "{}", err("0-8g"));
    assert!(err("0-8g,0-4g").contains("GPU 0 is named twice"));
    assert!(err("0-8g,7-4g").contains("there is no GPU 7"));
    assert!(err("0-8g,1-40g").contains("GPU 1 has only 24 GiB"), "{}", err("0-8g,1-40g"));
    assert!(err("0-8g,all-4g").contains("all-SIZE alone"));
    assert!(err("0-8x,1-4g").contains("0-8x"));
    assert!(err("0-0pct,1-4g").contains("whole percentage"));
    assert!(err("0-8g,1-4g,").contains("\"\""), "{}", err("0-8g,1-4g,"));
}

#[test]
fn nothing_to_generate_is_an_error() {
    assert!(matches!(plan(&gpus(), &[100 * GIB], &[], &[]), Err(PlanError::Nothing)));
}

#[test]
fn spec_mounts_library_preload_config_read_only_and_a_private_tmpfs() {
    let devices = plan(&gpus(), &[8 * GIB], &[], &[]).unwrap();
    let spec = spec(&devices, Path::new("/var/lib/fgpu/cdi"), Some(Path::new("/run/fgpu-service")));
    assert_eq!(spec["cdiVersion"], "0.5.0");
    assert_eq!(spec["kind"], "fgpu.io/gpu");
    let shared = spec["containerEdits"]["mounts"].as_array().unwrap();
    let find = |mounts: &[Value], path: &str| mounts.iter().find(|m| m["containerPath"] == path).cloned().unwrap();
    let options = |m: &Value| -> Vec<String> { m["options"].as_array().unwrap().iter().map(|o| o.as_str().unwrap().to_string()).collect() };
    let lib = find(shared, "/usr/lib/fgpu");
    assert_eq!(lib["hostPath"], "/var/lib/fgpu/cdi/lib");
    assert!(!options(&lib).contains(&"noexec".to_string()), "{lib}");
    let preload = find(shared, "/etc/ld.so.preload");
    assert_eq!(preload["hostPath"], "/var/lib/fgpu/cdi/ld.so.preload");
    let service = find(shared, "/run/fgpu-service");
    assert_eq!(service["hostPath"], "/run/fgpu-service");
    assert!(options(&service).contains(&"ro".to_string()));
    let tmpfs = find(shared, "/run/fgpu");
    assert_eq!(tmpfs["type"], "tmpfs");
    assert!(options(&tmpfs).contains(&"mode=1777".to_string()));
    let device = spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == "0-8g").unwrap();
    let conf = find(device["containerEdits"]["mounts"].as_array().unwrap(), "/etc/fgpu");
    assert_eq!(conf["hostPath"], "/var/lib/fgpu/cdi/devices/0-8g");
    for m in [&lib, &preload, &conf] {
        let o = options(m);
        assert!(["ro", "bind", "nosuid", "nodev"].iter().all(|w| o.contains(&w.to_string())), "{m}");
    }
    // Only fields that CDI 0.5.0 defines, in its order.
    assert_eq!(spec.as_object().unwrap().keys().collect::<Vec<_>>(), ["cdiVersion", "kind", "containerEdits", "devices"]);
    // The configuration the shim reads is the mounted directory's fgpu.conf.
    assert_eq!(Path::new(CONTAINER_CONFIG_DIR).join(CONFIG_FILE), Path::new(fgpu_core::config::CONFIG_PATH));
    assert_eq!(Path::new(CONTAINER_LIB_DIR).join(shimpath::FRONT_NAME), Path::new(CONTAINER_SHIM));
}

#[test]
fn preload_names_the_mounted_library() {
    assert_eq!(preload_text(), "/usr/lib/fgpu/libfgpu.so\n");
}

#[test]
fn yaml_is_block_style_with_json_scalars() {
    let value = json!({
        "cdiVersion": "0.5.0",
        "containerEdits": {"mounts": [{"hostPath": "/a b", "containerPath": "/c", "options": ["ro", "bind"]}]},
        "devices": [{"name": "0-8g", "containerEdits": {"mounts": []}}]
    });
    let expected = "\
cdiVersion: \"0.5.0\"
containerEdits:
  mounts:
    - hostPath: \"/a b\"
      containerPath: \"/c\"
      options: [\"ro\",\"bind\"]
devices:
  - name: \"0-8g\"
    containerEdits:
      mounts: []
";
    assert_eq!(to_yaml(&value), expected);
}
