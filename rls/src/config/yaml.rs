//! A YAML document as a tree whose every node knows its line, built from
//! yaml-rust2's event parser (its `Yaml` type forgets positions, and every
//! configuration error must name the line of the node at fault).
//!
//! Scalars keep their text and whether they were plain: envoyproxy/ratelimit
//! reads its files with gopkg.in/yaml.v2, which resolves plain scalars with
//! YAML 1.1's rules (`yes`/`on` are booleans, `~` is null), so the loader
//! interprets them with those rules, not YAML 1.2's.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// One node of a document.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) value: Value,
    /// 1-based line where the node starts.
    pub(crate) line: usize,
}

#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// A scalar: its text and whether it was written plain (unquoted,
    /// untagged), the only case where YAML 1.1 resolves it to a non-string.
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    /// Pairs in document order.
    Map(Vec<(Node, Node)>),
}

/// What a plain scalar resolves to under YAML 1.1 (yaml.v2's resolver).
#[derive(Debug, PartialEq)]
pub(crate) enum Resolved<'a> {
    Null,
    Bool(bool),
    Int(i128),
    Float,
    Str(&'a str),
}

impl Node {
    /// Resolves a scalar as yaml.v2 does; `None` for sequences and maps.
    pub(crate) fn resolve(&self) -> Option<Resolved<'_>> {
        match &self.value {
            Value::Scalar { text, plain: false } => Some(Resolved::Str(text)),
            Value::Scalar { text, plain: true } => Some(resolve_plain(text)),
            _ => None,
        }
    }

    /// Whether the node is YAML null (`~`, `null`, or nothing at all).
    pub(crate) fn is_null(&self) -> bool {
        self.resolve() == Some(Resolved::Null)
    }

    /// A short description for error messages.
    pub(crate) fn describe(&self) -> String {
        match &self.value {
            Value::Scalar { text, .. } => text.clone(),
            Value::Seq(_) => "a list".to_string(),
            Value::Map(_) => "a map".to_string(),
        }
    }
}

fn resolve_plain(text: &str) -> Resolved<'_> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Resolved::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Resolved::Bool(false)
        }
        _ => {}
    }
    if let Some(n) = parse_int(text) {
        return Resolved::Int(n);
    }
    if is_float(text) {
        return Resolved::Float;
    }
    Resolved::Str(text)
}

/// YAML 1.1 integers: decimal, `0x` hex, `0b` binary, `0o`/leading-0 octal,
/// optional sign, `_` separators.
fn parse_int(text: &str) -> Option<i128> {
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if body.is_empty() || body.starts_with('_') {
        return None;
    }
    let digits: String = body.chars().filter(|&c| c != '_').collect();
    let (radix, digits) = if let Some(rest) = digits.strip_prefix("0x") {
        (16, rest.to_string())
    } else if let Some(rest) = digits.strip_prefix("0b") {
        (2, rest.to_string())
    } else if let Some(rest) = digits.strip_prefix("0o") {
        (8, rest.to_string())
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, digits[1..].to_string())
    } else {
        (10, digits)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let n = i128::from_str_radix(&digits, radix).ok()?;
    Some(if negative { -n } else { n })
}

fn is_float(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if body == ".inf" || lower == ".nan" {
        return true;
    }
    let body: String = body.chars().filter(|&c| c != '_').collect();
    body.contains(|c: char| c.is_ascii_digit())
        && body.parse::<f64>().is_ok()
        && body
            .chars()
            .all(|c| c.is_ascii_digit() || ".e+-".contains(c))
}

/// A document that could not be parsed: the 1-based line and the parser's
/// words.
#[derive(Debug)]
pub(crate) struct SyntaxError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// Parses the first document of `text` (yaml.v2's `Unmarshal` reads only the
/// first). `Ok(None)` for a stream with no document (empty, or comments only).
pub(crate) fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = Builder::default();
    // The parser asserts on states it believes unreachable; a panic there on
    // a hostile file must refuse the file, not kill the service.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut parser = Parser::new_from_str(text);
        parser.load(&mut builder, false)
    }));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(SyntaxError {
                line: e.marker().line().max(1),
                message: e.info().to_string(),
            })
        }
        Err(_) => {
            return Err(SyntaxError {
                line: builder.last_line.max(1),
                message: "the YAML parser failed on this document".to_string(),
            })
        }
    }
    if let Some(e) = builder.error {
        return Err(e);
    }
    Ok(builder.root)
}

/// The most nodes a document may have once its aliases are expanded: far
/// above any real configuration, far below what exhausts memory (aliases
/// of aliases double the size at each level).
const MAX_NODES: usize = 1_000_000;

/// Builds the tree from events without recursion: open sequences and maps
/// are on a stack, each with its anchor and the node count when it opened.
#[derive(Default)]
struct Builder {
    stack: Vec<(Node, usize, usize)>,
    /// For an open map: a key waiting for its value.
    pending_keys: Vec<Option<Node>>,
    /// Anchored nodes with their sizes in nodes.
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes so far, aliases expanded.
    nodes: usize,
    root: Option<Node>,
    error: Option<SyntaxError>,
    last_line: usize,
}

impl Builder {
    fn push_node(&mut self, node: Node, anchor: usize, size: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        self.attach(node);
    }

    fn attach(&mut self, node: Node) {
        let Some((parent, _, _)) = self.stack.last_mut() else {
            if self.root.is_none() {
                self.root = Some(node);
            }
            return;
        };
        match &mut parent.value {
            Value::Seq(items) => items.push(node),
            Value::Map(pairs) => {
                let pending = self.pending_keys.last_mut().expect("a map has a key slot");
                match pending.take() {
                    None => *pending = Some(node),
                    Some(key) => pairs.push((key, node)),
                }
            }
            Value::Scalar { .. } => {}
        }
    }
}

fn is_string_tag(tag: &Option<Tag>) -> bool {
    tag.as_ref()
        .is_some_and(|t| t.suffix == "str" || t.suffix.ends_with(":str"))
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let line = mark.line().max(1);
        self.last_line = line;
        if self.error.is_some() {
            return;
        }
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                self.nodes += 1;
                let plain = style == TScalarStyle::Plain && !is_string_tag(&tag);
                let node = Node {
                    value: Value::Scalar { text, plain },
                    line,
                };
                self.push_node(node, anchor, 1);
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                let value = if matches!(event, Event::SequenceStart(..)) {
                    Value::Seq(Vec::new())
                } else {
                    Value::Map(Vec::new())
                };
                self.stack.push((Node { value, line }, anchor, self.nodes));
                self.nodes += 1;
                self.pending_keys.push(None);
            }
            Event::SequenceEnd | Event::MappingEnd => {
                self.pending_keys.pop();
                if let Some((node, anchor, first)) = self.stack.pop() {
                    let size = self.nodes - first;
                    self.push_node(node, anchor, size);
                }
            }
            Event::Alias(id) => match self.anchors.get(&id) {
                Some((_, size)) if self.nodes + size > MAX_NODES => {
                    self.error = Some(SyntaxError {
                        line,
                        message: format!("more than {MAX_NODES} nodes once aliases are expanded"),
                    })
                }
                Some((node, size)) => {
                    self.nodes += size;
                    let mut node = node.clone();
                    node.line = line;
                    self.attach(node);
                }
                None => {
                    self.error = Some(SyntaxError {
                        line,
                        message: "unknown anchor".to_string(),
                    })
                }
            },
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}
