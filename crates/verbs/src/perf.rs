//! Perf (to be written).
