//! placeholder: config (being written)
