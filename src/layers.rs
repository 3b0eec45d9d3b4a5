//! The layers of `src/`: every module names only modules below it, in the
//! order `docs/design.md` gives (its line `Bottom to top: ...`), so that
//! the modules form no circle.
//!
//! The check reads the sources as text: every `crate::x` path outside a
//! `//` comment (`use crate::x::...`, `use crate::{x, y}`, `crate::x::f()`,
//! `$crate::x` in a macro) is an edge from the file's top module (`src/x.rs`
//! or `src/x/...`) to `x`. A path to an item of the crate's root, or to a
//! module the order does not list, is refused too. Not followed: `super::`
//! from a top-level file (none exists: it would name the root) and this
//! file, which only reads the others.

use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Paths up the order that remain: (file, name). The check fails on any
/// other, and on one of these once it is gone (so the list only shrinks).
/// None is left.
const KNOWN: &[(&str, &str)] = &[];

/// The documented order, bottom first.
fn documented_order() -> Vec<String> {
    let design = std::fs::read_to_string(format!("{ROOT}/docs/design.md")).expect("docs/design.md");
    let line = design
        .lines()
        .find(|line| line.starts_with("Bottom to top:"))
        .expect("docs/design.md has a line `Bottom to top: ...`");
    line.split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

/// Every `.rs` file under `dir`, with its path from `src/`.
fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path
                .strip_prefix(format!("{ROOT}/src"))
                .expect("under src/")
                .to_string_lossy()
                .into_owned();
            out.push((name, std::fs::read_to_string(&path).expect("a source file")));
        }
    }
}

/// The top modules a line names after `crate::`.
fn named(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or_default();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the first name of each member.
            let (mut depth, mut start) = (0, 0);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.push(ident(&group[start..j]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(ident(&group[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|name| !name.is_empty());
    names
}

#[test]
fn every_module_names_only_modules_below_it() {
    let order = documented_order();
    let layer = |module: &str| order.iter().position(|m| m == module);
    let mut files = Vec::new();
    sources(Path::new(&format!("{ROOT}/src")), &mut files);
    let mut wrong = Vec::new();
    let mut known = Vec::new();
    for (file, text) in &files {
        if file == "lib.rs" || file == "layers.rs" {
            continue;
        }
        let module = file.split(['/', '.']).next().unwrap_or_default();
        let Some(own) = layer(module) else {
            wrong.push(format!(
                "{file}: module `{module}` is in no layer of docs/design.md"
            ));
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for target in named(line) {
                if KNOWN.contains(&(file.as_str(), target.as_str())) {
                    known.push((file.clone(), target));
                    continue;
                }
                match layer(&target) {
                    Some(below) if below < own || target == module => {}
                    Some(_) => wrong.push(format!(
                        "{file}:{}: `{module}` names `{target}`, not below it",
                        n + 1
                    )),
                    None => wrong.push(format!(
                        "{file}:{}: `{module}` names `crate::{target}`, in no layer",
                        n + 1
                    )),
                }
            }
        }
    }
    assert!(files.len() > 10, "found the sources");
    for &(file, target) in KNOWN {
        if !known.iter().any(|(f, t)| f == file && t == target) {
            wrong.push(format!(
                "{file} no longer names `{target}`: drop it from KNOWN"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "import layers broken:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn paths_are_read_in_every_form() {
    assert_eq!(named("use crate::args::{parse_int, Params};"), ["args"]);
    assert_eq!(
        named("use crate::{config, deny_log::{len, MAX_LEN}, policy};"),
        ["config", "deny_log", "policy"]
    );
    assert_eq!(
        named("    x = crate::stats::ALL.get() + crate::ffi::allocations();"),
        ["stats", "ffi"]
    );
    assert_eq!(named("type $d L = $crate::limiter::$Alg;"), ["limiter"]);
    assert!(named("// see crate::commands").is_empty());
}

/// The lists of `src/ffi/`'s files, in `src/ffi/mod.rs`'s documentation
/// and in `docs/design.md`'s table ("One home for the module API"), name
/// every file there is, and no file that is not.
#[test]
fn the_lists_of_ffi_files_are_the_files() {
    let mut files: Vec<String> = std::fs::read_dir(format!("{ROOT}/src/ffi"))
        .expect("src/ffi is readable")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".rs"))
        .collect();
    files.sort();
    // `name.rs` in backquotes, as the lists spell them.
    let quoted = |text: &str, prefix: &str| -> Vec<String> {
        let mut names: Vec<String> = text
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|s| s.strip_prefix(prefix))
            .filter(|s| s.ends_with(".rs") && !s.contains('/'))
            .map(String::from)
            .collect();
        names.sort();
        names.dedup();
        names
    };
    let module = std::fs::read_to_string(format!("{ROOT}/src/ffi/mod.rs")).expect("mod.rs");
    let doc: String = module
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let without_mod: Vec<String> = files.iter().filter(|f| *f != "mod.rs").cloned().collect();
    assert_eq!(
        quoted(&doc, ""),
        without_mod,
        "src/ffi/mod.rs's list of files"
    );
    let design = std::fs::read_to_string(format!("{ROOT}/docs/design.md")).expect("design.md");
    let section = design
        .split("## One home for the module API")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/design.md has the section");
    let table: String = section
        .lines()
        .filter(|line| line.starts_with("| `ffi/"))
        .map(|line| line.split(" | ").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(
        quoted(&table, "ffi/"),
        files,
        "docs/design.md's table of src/ffi/"
    );
}

/// The files of `src/commands/` form no import circle: a file names
/// (`super::file`, outside comments) only files that do not name it back,
/// directly or through others. `mod.rs`, the dispatcher and the table of
/// commands, is their root and not counted.
#[test]
fn the_command_files_form_no_circle() {
    let dir = format!("{ROOT}/src/commands");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("src/commands is readable")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| {
            let stem = p
                .file_stem()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            (stem, std::fs::read_to_string(&p).expect("a source file"))
        })
        .filter(|(stem, _)| stem != "mod")
        .collect();
    files.sort();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let edges: Vec<Vec<usize>> = files
        .iter()
        .map(|(from, text)| {
            let mut to: Vec<usize> = text
                .lines()
                .map(|line| line.split("//").next().unwrap_or_default())
                .flat_map(|code| code.split("super::").skip(1).map(String::from))
                .filter_map(|rest| {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    names.iter().position(|n| *n == name)
                })
                .filter(|&i| names[i] != from)
                .collect();
            to.sort_unstable();
            to.dedup();
            to
        })
        .collect();
    // Depth-first, with the path so far: a file met again on it closes a
    // circle, which is answered.
    fn visit(
        i: usize,
        edges: &[Vec<usize>],
        path: &mut Vec<usize>,
        done: &mut [bool],
    ) -> Result<(), Vec<usize>> {
        if let Some(at) = path.iter().position(|&p| p == i) {
            return Err(path[at..].to_vec());
        }
        if done[i] {
            return Ok(());
        }
        path.push(i);
        for &j in &edges[i] {
            visit(j, edges, path, done)?;
        }
        path.pop();
        done[i] = true;
        Ok(())
    }
    let mut done = vec![false; files.len()];
    for i in 0..files.len() {
        if let Err(circle) = visit(i, &edges, &mut Vec::new(), &mut done) {
            let circle: Vec<&str> = circle.iter().map(|&p| names[p]).collect();
            panic!("src/commands/ has an import circle through {circle:?}");
        }
    }
    assert!(
        edges.iter().any(|e| !e.is_empty()),
        "no edge read: the check reads nothing"
    );
}
