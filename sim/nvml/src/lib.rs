//! simulated libnvidia-ml: placeholder
