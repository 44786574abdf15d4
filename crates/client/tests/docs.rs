//! docs/client.md shows this crate's examples/lock.rs as it is, and its `Cargo.toml`
//! lines give everything that example uses. (The example itself is built
//! by `cargo build --examples` and clippy's `--all-targets`.)

use std::path::Path;

/// `path` relative to this crate (`../../` is the repository's root).
fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The fenced blocks of `text` with the given info string, in order.
fn blocks(text: &str, info: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line == format!("```{info}") => current = Some(String::new()),
            Some(_) if line == "```" => out.push(current.take().unwrap()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

#[test]
fn the_documented_example_is_examples_lock_rs() {
    let doc = read("../../docs/client.md");
    let example = read("examples/lock.rs");
    let rust = blocks(&doc, "rust");
    assert!(
        rust.contains(&example),
        "docs/client.md has no ```rust block equal to examples/lock.rs; update one from the other"
    );
}

#[test]
fn the_documented_cargo_toml_has_what_the_example_uses() {
    let doc = read("../../docs/client.md");
    let example = read("examples/lock.rs");
    let toml = blocks(&doc, "toml");
    let deps = toml
        .iter()
        .find(|b| b.contains("[dependencies]"))
        .expect("a Cargo.toml snippet with [dependencies]");
    assert!(
        deps.lines().any(|l| l.starts_with("ringlock-client = {")),
        "{deps}"
    );
    let tokio = deps
        .lines()
        .find(|l| l.starts_with("tokio = {"))
        .expect("a tokio line");
    // What the example uses, and the tokio feature each needs.
    let needs = [
        ("#[tokio::main]", "macros"),
        ("#[tokio::main]", "rt-multi-thread"),
        ("tokio::select!", "macros"),
        ("tokio::time::", "time"),
        ("tokio::spawn", "rt"),
        ("tokio::net::", "net"),
        ("tokio::sync::", "sync"),
        ("tokio::io::", "io-util"),
    ];
    for (used, feature) in needs {
        if example.contains(used) {
            let listed = tokio.contains(&format!("\"{feature}\""))
                || (feature == "rt" && tokio.contains("\"rt-multi-thread\""));
            assert!(
                listed,
                "the example uses {used}: the tokio line needs \"{feature}\": {tokio}"
            );
        }
    }
    // And nothing but ringlock-client and tokio.
    for line in example.lines().filter(|l| l.starts_with("use ")) {
        let krate = line["use ".len()..].split("::").next().unwrap();
        assert!(
            ["std", "ringlock_client", "tokio"].contains(&krate),
            "the example uses crate {krate}, which the snippet does not list"
        );
    }
}
