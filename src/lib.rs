pub mod recipe;
