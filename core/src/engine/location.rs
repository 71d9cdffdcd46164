//! Where ops come from: the source line (the user's Python line, or a C
//! caller's text) each thread's ops are recorded at, interned as ids, which
//! errors and recompile explanations name.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

thread_local! {
    static CURRENT_LOCATION: Cell<u32> = const { Cell::new(0) };
}

/// Interned location texts: by id, and ids by text.
struct Locations {
    texts: Vec<String>,
    ids: HashMap<String, u32>,
}

fn locations() -> MutexGuard<'static, Locations> {
    static LOCATIONS: OnceLock<Mutex<Locations>> = OnceLock::new();
    LOCATIONS
        .get_or_init(|| {
            Mutex::new(Locations {
                texts: vec!["an unknown line".to_string()],
                ids: HashMap::new(),
            })
        })
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The id of a source location ("train.py:42 in step"); equal texts share
/// an id. Id 0 is the unknown location.
pub fn intern_location(text: &str) -> u32 {
    let mut table = locations();
    if let Some(&id) = table.ids.get(text) {
        return id;
    }
    let id = table.texts.len() as u32;
    table.texts.push(text.to_string());
    table.ids.insert(text.to_string(), id);
    id
}

/// The text of location `id`.
pub fn location_text(id: u32) -> String {
    let table = locations();
    table
        .texts
        .get(id as usize)
        .unwrap_or(&table.texts[0])
        .clone()
}

/// Sets the location the calling thread's next ops are recorded at.
pub fn set_current_location(id: u32) {
    CURRENT_LOCATION.with(|c| c.set(id));
}

pub fn current_location() -> u32 {
    CURRENT_LOCATION.with(Cell::get)
}
