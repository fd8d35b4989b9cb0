//! oncrpc (design overview to be written with the crate).
