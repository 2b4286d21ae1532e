#[path = "../support/mod.rs"]
mod support;

mod fixtures_smoke;
