//! The kotlin target (being written).

use super::model::Model;
use super::GeneratedFile;

/// Every kotlin file the generator writes.
pub fn generate(_model: &Model) -> Vec<GeneratedFile> {
    Vec::new()
}
