//! Without the `fault-injection` feature, fault points compile to nothing.

macro_rules! fault_point {
    ($point:ident, $header:expr) => {};
}
pub(crate) use fault_point;
