//! test support: placeholder
