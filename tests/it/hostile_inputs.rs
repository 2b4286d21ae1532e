//! Issue 15: see the tests below.
