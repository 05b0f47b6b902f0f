//! The ledger's entries for MIG devices: kept apart from each other and from their GPU.

use super::*;

/// Two MIG devices of one GPU and the GPU itself are three entries, each with its own cap
/// and count, printed as NVML prints them. An entry that an fgpu without kinds made for a
/// MIG device (it recorded the same bytes, and 0 where the kind now is) is read as that
/// device's: a process that knows it is a MIG device joins it, its count and cap are the
/// same, and from then on it is printed as one.
#[test]
fn mig_devices_keep_their_kind_and_never_share_an_entry() {
    use crate::uuid::DeviceUuid;
    let dir = TempDir::new("mig");
    let ledger = Ledger::open_or_create(&dir.ledger()).unwrap();
    let me = ledger.join().unwrap();
    let gpu = DeviceUuid::gpu([0x10; 16]);
    let (a, b) = (DeviceUuid::mig([0xa0; 16]), DeviceUuid::mig([0xb0; 16]));
    let reg = |u: DeviceUuid, cap: u64| ledger.register_device(u, 40 << 30, cap, Some(me)).unwrap();
    let ids = [reg(a, 2 << 30).device, reg(b, 3 << 30).device, reg(gpu, 4 << 30).device];
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2], "{ids:?}");
    ledger.reserve(me, ids[0], 100 * MIB, 2 << 30).unwrap();
    ledger.reserve(me, ids[1], 30 * MIB, 3 << 30).unwrap();
    let snap = ledger.snapshot(Some(me));
    let shown: Vec<(String, u64, u64)> = snap.devices.iter().map(|d| (d.uuid_string(), d.cap, d.used)).collect();
    assert_eq!(
        shown,
        [(a.to_string(), 2 << 30, 100 * MIB), (b.to_string(), 3 << 30, 30 * MIB), ("GPU-10101010-1010-1010-1010-101010101010".to_string(), 4 << 30, 0)]
    );
    assert!(shown[0].0.starts_with("MIG-a0a0a0a0-"), "{shown:?}");
    assert_eq!((ledger.find_device(a.bytes), ledger.find_device(gpu.bytes)), (Some(ids[0]), Some(ids[2])));

    // An older fgpu's entry for a third instance: its bytes, kind 0, its cap, a count.
    let c = DeviceUuid::mig([0xc0; 16]);
    let old = reg(DeviceUuid::gpu(c.bytes), 1 << 30).device;
    ledger.device(old).kind.store(KIND_UNKNOWN, Relaxed);
    ledger.reserve(me, old, 50 * MIB, 1 << 30).unwrap();
    let name = |id: DeviceId| ledger.snapshot(Some(me)).devices.iter().find(|d| d.id == id).unwrap().uuid_string();
    assert!(name(old).starts_with("GPU-c0c0c0c0-"), "printed as the older fgpu printed it");
    // A second process that knows the instance joins the same entry: the ledger's cap (the
    // first process is alive) and the count are the older one's.
    let other = Ledger::open_or_create(&dir.ledger()).unwrap();
    let other_slot = other.join().unwrap();
    let joined = other.register_device(c, 40 << 30, 8 << 30, Some(other_slot)).unwrap();
    assert_eq!((joined.device, joined.ledger_cap, other.used(joined.device)), (old, 1 << 30, 50 * MIB));
    assert!(name(old).starts_with("MIG-c0c0c0c0-"), "now recorded as a MIG device");
    // A kind once recorded stays: nothing can turn an instance into a GPU.
    other.register_device(DeviceUuid::gpu(c.bytes), 40 << 30, 8 << 30, Some(other_slot)).unwrap();
    assert!(name(old).starts_with("MIG-"));
}
