//! placeholder: scenario (being written)
