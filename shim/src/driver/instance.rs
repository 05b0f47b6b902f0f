//! Which driver this build calls: the real one, or under `cargo test` the fake of
//! `fake.rs`, chosen at compile time (as youki's `create_syscall` chooses), so that every
//! call is a direct one. The accounting and the compute limiter reach the driver through
//! [`driver`] only.

#[cfg(not(test))]
pub type Drv = super::seam::Real;
#[cfg(test)]
pub type Drv = super::fake::Fake;

/// The driver this build calls.
#[inline(always)]
pub fn driver() -> &'static Drv {
    #[cfg(not(test))]
    {
        &super::seam::Real
    }
    #[cfg(test)]
    {
        &super::fake::FAKE
    }
}
