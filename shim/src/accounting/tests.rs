//! Reserve, call, settle against a real ledger (in the test's own directory) with the fake
//! driver: what the ledger counts after a driver that refuses, one that panics, one that
//! takes more or less than asked, and frees that race allocations; and the cap a device is
//! registered with, over every combination of the process's cap, the ledger's and the
//! device's size. The ledger's own figures are the ground truth.

use super::active::Active;
use crate::abi::cuda::*;
use crate::process::devices::Dev;
use crate::testing::{Process, GIB, MIB};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

/// What this process holds on `dev` in the ledger (reservations in flight included, its
/// unspent credit left out).
fn held(active: &Active, dev: &Dev) -> u64 {
    active.account.ledger().slot_used(active.account.slot().unwrap(), dev.id)
}

#[test]
fn a_call_the_driver_refuses_gives_its_reservation_back() {
    let p = Process::new("refused", &[("FGPU_LIMIT", "1G")], 80 * GIB);
    let a = &p.active;
    let dev = a.account.device(0).unwrap();
    assert_eq!(dev.limit, GIB);
    let mut during = None;
    let rc = a.counted_alloc(dev, "cuMemAlloc", 512 * MIB, || {
        during = Some(held(a, dev));
        (CUDA_ERROR_INVALID_VALUE, 0, 0)
    });
    assert_eq!(rc, CUDA_ERROR_INVALID_VALUE, "the driver's answer is returned");
    assert_eq!(during, Some(512 * MIB), "the bytes are reserved before the driver is called");
    assert_eq!(held(a, dev), 0, "a refused call leaves nothing counted");
    // The whole cap is still there to take, and nothing past it.
    assert_eq!(a.counted_alloc(dev, "cuMemAlloc", GIB, || (CUDA_SUCCESS, 0x7000_0000, GIB)), CUDA_SUCCESS);
    assert_eq!(held(a, dev), GIB);
    let mut called = false;
    let rc = a.counted_alloc(dev, "cuMemAlloc", 1, || {
        called = true;
        (CUDA_SUCCESS, 0x7100_0000, 1)
    });
    assert_eq!(rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert!(!called, "a call past the cap never reaches the driver");
    assert_eq!(held(a, dev), GIB);
    assert_eq!(a.counted_free(0x7000_0000, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(held(a, dev), 0);
}

#[test]
fn a_driver_that_panics_leaves_nothing_counted() {
    let p = Process::new("panics", &[("FGPU_LIMIT", "1G")], 80 * GIB);
    let a = &p.active;
    let dev = a.account.device(0).unwrap();
    let caught = catch_unwind(AssertUnwindSafe(|| a.counted_alloc(dev, "cuMemAlloc", 768 * MIB, || panic!("the driver call panicked"))));
    assert!(caught.is_err());
    assert_eq!(held(a, dev), 0, "the reservation is given back while unwinding");
    let caught = catch_unwind(AssertUnwindSafe(|| a.counted_array("cuArrayCreate", 256 * MIB, false, || panic!("the driver call panicked"))));
    assert!(caught.is_err());
    assert_eq!(held(a, dev), 0, "an array's reservation too");
    // A panic in the free's driver call keeps the record out of the map, but the count is
    // not given back for memory the driver may still hold: the next free of the address
    // finds nothing (the count stays, which never lets the process past its cap).
    assert_eq!(a.counted_alloc(dev, "cuMemAlloc", GIB, || (CUDA_SUCCESS, 0x7000_0000, GIB)), CUDA_SUCCESS);
    assert!(catch_unwind(AssertUnwindSafe(|| a.counted_free(0x7000_0000, || panic!("the free panicked")))).is_err());
    assert_eq!(held(a, dev), GIB, "a free that never answered gives nothing back");
}

#[test]
fn a_reservation_settles_to_what_the_driver_took() {
    let p = Process::new("settles", &[("FGPU_LIMIT", "1G")], 80 * GIB);
    let a = &p.active;
    let dev = a.account.device(0).unwrap();
    // A pitched allocation takes more than asked: the excess is counted, past nothing.
    assert_eq!(a.counted_alloc(dev, "cuMemAllocPitch", 100 * MIB, || (CUDA_SUCCESS, 0x7000_0000, 101 * MIB)), CUDA_SUCCESS);
    assert_eq!(held(a, dev), 101 * MIB);
    // An array smaller than its estimate: the difference goes back.
    assert_eq!(a.counted_alloc(dev, "cuMemAlloc", 100 * MIB, || (CUDA_SUCCESS, 0x7100_0000, 60 * MIB)), CUDA_SUCCESS);
    assert_eq!(held(a, dev), 161 * MIB);
    assert_eq!(a.counted_free(0x7000_0000, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(a.counted_free(0x7100_0000, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(held(a, dev), 0, "each free gives back what was settled, not what was asked");
}

#[test]
fn a_free_racing_an_allocation_at_the_same_address_keeps_both_counts_right() {
    let p = Process::new("racing-free", &[("FGPU_LIMIT", "1G")], 80 * GIB);
    let a = &p.active;
    let dev = a.account.device(0).unwrap();
    let ptr = 0x7000_0000;
    assert_eq!(a.counted_alloc(dev, "cuMemAlloc", 100 * MIB, || (CUDA_SUCCESS, ptr, 100 * MIB)), CUDA_SUCCESS);
    // While the driver frees, another thread is handed the same address for 200 MiB.
    let rc = a.counted_free(ptr, || {
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(a.counted_alloc(dev, "cuMemAlloc", 200 * MIB, || (CUDA_SUCCESS, ptr, 200 * MIB)), CUDA_SUCCESS));
        });
        CUDA_SUCCESS
    });
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(held(a, dev), 200 * MIB, "the free gave back the old allocation's 100 MiB, not the new one's");
    // A free the driver refuses keeps the record and the count.
    assert_eq!(a.counted_free(ptr, || CUDA_ERROR_INVALID_VALUE), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(held(a, dev), 200 * MIB);
    assert_eq!(a.counted_free(ptr, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(held(a, dev), 0, "the new allocation's record was kept, and its free gives back 200 MiB");
    // A free of an address nobody counted gives nothing back.
    assert_eq!(a.counted_free(0x7200_0000, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(held(a, dev), 0);
}

#[test]
fn racing_allocations_and_frees_never_pass_the_cap() {
    let p = Process::new("racing-threads", &[("FGPU_LIMIT", "1G")], 80 * GIB);
    let a = &p.active;
    let dev = a.account.device(0).unwrap();
    let most = AtomicU64::new(0);
    let granted = AtomicU64::new(0);
    let refused = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (most, granted, refused) = (&most, &granted, &refused);
            s.spawn(move || {
                for round in 0..300u64 {
                    let ptr = 0x1_0000_0000 + (t << 32) + (round << 12);
                    let bytes = (96 + 32 * t) * MIB;
                    let rc = a.counted_alloc(dev, "cuMemAlloc", bytes, || {
                        // Reserved before the call: whatever the other threads do, the
                        // ledger never holds more than the cap.
                        most.fetch_max(a.account.ledger().used(dev.id), Ordering::Relaxed);
                        (CUDA_SUCCESS, ptr, bytes)
                    });
                    if rc == CUDA_SUCCESS {
                        granted.fetch_add(1, Ordering::Relaxed);
                        if round % 3 != 0 {
                            assert_eq!(a.counted_free(ptr, || CUDA_SUCCESS), CUDA_SUCCESS);
                        }
                    } else {
                        assert_eq!(rc, CUDA_ERROR_OUT_OF_MEMORY);
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let (most, granted, refused) = (most.load(Ordering::Relaxed), granted.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    assert!(most <= GIB, "the ledger held {most} at most");
    // The race happened near the cap: the threads keep a third of what they allocate, so
    // the ledger fills past half the cap and allocations are refused; a run that never
    // came near the cap would prove nothing.
    assert!(granted > 0 && most > GIB / 2 && refused > 0, "the threads never pressed the cap: peak {most} of {GIB}, {granted} granted, {refused} refused");
    // What is left counted is exactly what was never freed.
    let mut left = 0;
    for t in 0..4u64 {
        for round in (0..300u64).step_by(3) {
            let ptr = 0x1_0000_0000 + (t << 32) + (round << 12);
            if let Some(alloc) = a.allocs.remove(ptr) {
                left += alloc.bytes;
            }
        }
    }
    assert_eq!(held(a, dev), left);
}

/// The cap a device is registered with, over every combination of this process's cap (none
/// named for the device, below, equal to and above the others), the ledger's (another
/// process registered the device first, or nobody did) and the device's size. The rule,
/// written out plainly: the smaller of the process's cap (the whole device where it names
/// none) and the ledger's; programs are told that, but never more than the device.
#[test]
fn every_combination_of_cap_ledger_cap_and_device_size_registers_its_cap() {
    let caps: [Option<u64>; 5] = [None, Some(GIB), Some(4 * GIB), Some(8 * GIB), Some(100 * GIB)];
    let spec = |cap: Option<u64>| cap.map_or("GPU-ffffffff=1G".to_string(), |c| format!("{}", c));
    let mut seen = 0;
    for device in [4 * GIB, 8 * GIB, 80 * GIB] {
        for own in caps {
            for first in std::iter::once(None).chain(caps.iter().map(|c| Some(*c))) {
                let p = Process::new("caps", &[("FGPU_LIMIT", &spec(own))], device);
                // The ledger's cap: set by the first process to register the device, which
                // lives on (a ledger with no other live process takes the newcomer's cap).
                let other = first.map(|first| p.another(&[("FGPU_LIMIT", &spec(first))]));
                let ledger_cap = other.as_ref().map(|other| other.account.device(0).unwrap().limit);
                let a = &p.active;
                let dev = a.account.device(0).unwrap();
                let asked = own.unwrap_or(device);
                let expect = match ledger_cap {
                    Some(l) if l < asked => l,
                    _ => asked,
                };
                let what = format!("own {own:?}, ledger {ledger_cap:?}, device {device}");
                assert_eq!(dev.limit, expect, "cap for {what}");
                assert_eq!(dev.shown, if expect > device { device } else { expect }, "shown for {what}");
                assert_eq!(dev.total, device);
                assert_eq!(a.account.ledger().cap(dev.id), ledger_cap.unwrap_or(asked), "the ledger keeps its first cap ({what})");
                // The cap holds in the ledger: all of it can be reserved, and not a byte more.
                assert_eq!(a.counted_alloc(dev, "cuMemAlloc", expect, || (CUDA_SUCCESS, 0x7000_0000, expect)), CUDA_SUCCESS, "{what}");
                assert_eq!(a.counted_alloc(dev, "cuMemAlloc", 1, || (CUDA_SUCCESS, 0x7100_0000, 1)), CUDA_ERROR_OUT_OF_MEMORY, "{what}");
                seen += 1;
            }
        }
    }
    assert_eq!(seen, 3 * 5 * 6);
}
