//! simulated libcuda: placeholder
