//! placeholder: tools (being written)
