//! The checks of `fgpu doctor`, one function each, in the order they are printed: the
//! front and the shim it loads (`shim.rs`), what is preloaded (`preload.rs`), the cap and
//! the compute share (`cap.rs`), the driver (`driver.rs`), the ledger and the room for
//! ledgers (`ledger.rs`), the PID namespace (`pidns.rs`), other interposers
//! (`interposer.rs`). Each reads [`Facts`] only, so each is unit-tested with made-up facts.

pub mod cap;
pub mod driver;
pub mod interposer;
pub mod ledger;
pub mod pidns;
pub mod preload;
pub mod shim;

use super::facts::Facts;
use super::finding::Finding;

/// Every finding, in order.
pub fn assess(f: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    let shim_ok = shim::check(f, &mut out);
    let preloaded = preload::check(f, &mut out);
    let config = cap::checked_config(f);
    cap::check_warnings(&config, &mut out);
    cap::check(f, &config, preloaded, &mut out);
    cap::check_compute(&config, preloaded, &mut out);
    driver::check(f, &mut out);
    ledger::check(f, &mut out);
    ledger::check_shm(f, &mut out);
    pidns::check(f, &mut out);
    interposer::check(f, &mut out);
    if !shim_ok {
        // A preloaded front or a shim that cannot load does nothing; say so with the cap finding.
        cap::withdraw(&mut out);
    }
    out
}
