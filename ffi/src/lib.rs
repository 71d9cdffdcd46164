//! rtpu's C ABI.
