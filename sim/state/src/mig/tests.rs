use super::*;
use crate::temp_state::{TempSim, TempState};
use crate::{SimConfig, SimState, MAX_PROCESSES};

const GIB: u64 = 1 << 30;

fn state(name: &str, product: Product, mig: u32) -> TempSim {
    TempState::new(&format!("mig-{name}")).open_with(&SimConfig { devices: 2, product, mig, ..SimConfig::default() })
}

/// Creates one GPU instance per profile ID in `ids`, with no placement, and returns the IDs
/// the driver gave them (an error ends the list).
fn create_all(s: &SimState, ids: &[u32]) -> Vec<Result<u32, MigError>> {
    ids.iter().map(|&p| s.create_gpu_instance(0, p, None).map(|g| g.id)).collect()
}

#[test]
fn the_default_placements_give_the_ids_of_the_published_examples() {
    // The MIG user guide's examples (an A100) and an H100's `-cgi 19 x7`.
    type Case<'a> = (&'a [u32], &'a [Result<u32, MigError>]);
    let cases: [Case; 5] = [
        (&[9, 9], &[Ok(2), Ok(1)]),
        (&[19, 19, 14, 9], &[Ok(13), Ok(11), Ok(3), Err(MigError::InsufficientResources)]),
        (&[9, 19, 14, 19], &[Ok(2), Ok(7), Ok(4), Ok(8)]),
        (&[14, 19, 19, 19, 19, 19], &[Ok(5), Ok(13), Ok(7), Ok(8), Ok(9), Ok(10)]),
        (&[19, 19, 19, 19, 19, 19, 19], &[Ok(13), Ok(11), Ok(12), Ok(7), Ok(8), Ok(9), Ok(10)]),
    ];
    for (k, (ids, want)) in cases.iter().enumerate() {
        for product in [Product::A100_80GB, Product::H100_80GB] {
            let s = state(&format!("examples-{k}-{}", product.key()), product, 1);
            assert_eq!(create_all(&s, ids), want.to_vec(), "-cgi {ids:?} on {product:?}");
        }
    }
}

#[test]
fn placements_are_checked_and_ids_follow_the_span() {
    let s = state("placements", Product::H100_80GB, 1);
    assert_eq!(s.gpu_instance_placements(0, 15).unwrap(), vec![(0, 2), (2, 2), (4, 2), (6, 2)]);
    let g = s.create_gpu_instance(0, 15, Some(6)).unwrap();
    assert_eq!((g.id, g.start, g.size), (6, 6, 2));
    assert_eq!(s.create_gpu_instance(0, 19, Some(6)), Err(MigError::InsufficientResources), "a taken placement");
    assert_eq!(s.create_gpu_instance(0, 19, Some(7)), Err(MigError::InvalidArgument), "not a placement of 1g");
    assert_eq!(s.create_gpu_instance(0, 3, None), Err(MigError::InvalidArgument), "no profile has ID 3");
    assert_eq!(s.gpu_instance_capacity(0, 19).unwrap(), 6);
    assert_eq!(s.gpu_instance_capacity(0, 0).unwrap(), 0);
    assert_eq!(s.gpu_instance_capacity(0, 9).unwrap(), 1, "0:4 is free, 4:4 is not");
    let me = s.create_gpu_instance(0, 20, None).unwrap();
    assert_eq!(s.gpu_instance_capacity(0, 20).unwrap(), 0, "+me has one instance at most");
    assert_eq!(s.create_gpu_instance(0, 20, None), Err(MigError::InsufficientResources));
    assert_eq!(s.destroy_gpu_instance(0, me.id), Ok(()));
    assert_eq!(s.destroy_gpu_instance(0, me.id), Err(MigError::NotFound));
    assert_eq!(s.gpu_instances(0).unwrap().iter().map(|g| g.id).collect::<Vec<_>>(), vec![6]);
}

#[test]
fn compute_instances_block_their_gpu_instance_and_get_new_uuids() {
    let s = state("compute", Product::A100_80GB, 1);
    let gi = s.create_gpu_instance(0, 9, None).unwrap();
    let names: Vec<(u32, u32, u32, String)> = s.compute_instance_profiles(0, gi.id).unwrap().into_iter().map(|p| (p.index, p.count, p.sms, p.name)).collect();
    assert_eq!(names, vec![(0, 3, 14, "1c.3g.40gb".into()), (1, 1, 28, "2c.3g.40gb".into()), (2, 1, 42, "3g.40gb".into())]);
    let a = s.create_compute_instance(0, gi.id, 0, None).unwrap();
    let b = s.create_compute_instance(0, gi.id, 0, None).unwrap();
    assert_eq!((a.id, a.start, b.id, b.start), (0, 0, 1, 1));
    assert_eq!(s.compute_instance_capacity(0, gi.id, 1).unwrap(), 0, "2c needs slices 0-1");
    assert_eq!(s.create_compute_instance(0, gi.id, 1, None), Err(MigError::InsufficientResources));
    assert_eq!(s.destroy_gpu_instance(0, gi.id), Err(MigError::InUse), "compute instances remain");
    assert_ne!(a.uuid, b.uuid);
    assert_ne!(a.lane, b.lane);
    s.destroy_compute_instance(0, gi.id, 0).unwrap();
    let again = s.create_compute_instance(0, gi.id, 0, None).unwrap();
    assert_eq!(again.id, 0);
    assert_ne!(again.uuid, a.uuid, "a new UUID at each creation");
    let devices = s.mig_devices(0);
    assert_eq!(devices.len(), 2);
    assert!(devices[0].uuid_string().starts_with("MIG-") && devices[0].uuid_string().len() == 40, "{}", devices[0].uuid_string());
    assert_eq!(s.mig_device_by_uuid(&devices[1].uuid_string()).map(|m| m.index), Some(1));
}

#[test]
fn a_bound_process_takes_its_memory_from_the_gpu_instance() {
    let s = state("bound", Product::H100_80GB, 1);
    let gi = s.create_gpu_instance(0, 19, None).unwrap();
    s.create_compute_instance(0, gi.id, 0, None).unwrap();
    let mig = s.mig_devices(0).remove(0);
    let slot = s.register().unwrap();
    s.bind_mig_device(slot, &mig).unwrap();
    assert_eq!(mig.memory(), 9984 << 20);
    assert!(s.try_alloc(slot, 0, 9 * GIB));
    assert!(!s.try_alloc(slot, 0, GIB), "the GPU instance's memory is the limit, not the GPU's");
    assert_eq!(s.gpu_instance_used(0, gi.id), 9 * GIB);
    assert_eq!(s.device_used(0), 9 * GIB, "the GPU sees the sum of its instances");
    assert_eq!(s.destroy_compute_instance(0, gi.id, 0), Err(MigError::InUse));
    assert_eq!(s.set_mig_mode(0, false), Ok(Err(MigError::InUse)));
    assert_eq!(s.mig_mode(0), Ok((true, false)), "pending disable while in use");
    s.release(slot, 0, 9 * GIB);
    assert_eq!(s.gpu_instance_used(0, gi.id), 0);
    assert!(MAX_PROCESSES > slot);
}

#[test]
fn mig_mode_needs_a_reset_on_ampere_only() {
    let h = state("mode-h100", Product::H100_80GB, 0);
    assert_eq!(h.mig_mode(0), Ok((false, false)));
    assert_eq!(h.gpu_instances(0), Err(MigError::NotSupported), "MIG off");
    assert_eq!(h.set_mig_mode(0, true), Ok(Ok(())));
    assert_eq!(h.mig_mode(0), Ok((true, true)));
    h.create_gpu_instance(0, 0, None).unwrap();
    h.reboot().unwrap();
    assert_eq!(h.mig_mode(0), Ok((false, false)), "Hopper forgets MIG mode at a reboot");

    let a = state("mode-a100", Product::A100_80GB, 0);
    assert_eq!(a.set_mig_mode(1, true), Ok(Err(MigError::ResetRequired)));
    assert_eq!(a.mig_mode(1), Ok((false, true)), "pending until a reset");
    assert_eq!(a.mig_mode(0), Ok((false, false)), "the other GPU is untouched");
    a.reset_gpu(1).unwrap();
    assert_eq!(a.mig_mode(1), Ok((true, true)));
    a.reboot().unwrap();
    assert_eq!(a.mig_mode(1), Ok((true, true)), "Ampere's InfoROM keeps it");

    let g = state("mode-generic", Product::Generic, 0);
    assert_eq!(g.mig_mode(0), Err(MigError::NotSupported));
    assert_eq!(g.set_mig_mode(0, true), Err(MigError::NotSupported));
}
