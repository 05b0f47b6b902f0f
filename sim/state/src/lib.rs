//! simulated driver state: placeholder
