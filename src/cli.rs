//! placeholder: cli (being written)
