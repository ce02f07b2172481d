//! placeholder: store (being written)
