//! The typescript target (being written).

use super::model::Model;
use super::GeneratedFile;

/// Every typescript file the generator writes.
pub fn generate(_model: &Model) -> Vec<GeneratedFile> {
    Vec::new()
}
