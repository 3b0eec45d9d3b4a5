//! From a file's YAML tree to descriptors, with the reference's checks (and
//! its messages where it has one) plus our extensions' checks.

use std::path::Path;
use std::sync::Arc;

use super::yaml::{self, Node, Resolved, Value};
use super::{Algorithm, Config, ConfigError, Descriptor, Level, Limit, Rule, Unit};

/// The keys envoyproxy/ratelimit knows. It checks every map of a file
/// against this one list, wherever the map is, and then ignores keys that
/// are valid but misplaced (`shadow_mode` inside `rate_limit`, say); we do
/// the same so that every file it loads loads here.
const REFERENCE_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
];

/// Our keys, valid inside `rate_limit` only.
const EXTENSION_KEYS: &[&str] = &["algorithm", "unit_multiplier", "burst", "buckets"];

/// Default sub-buckets per period of a hash_window limit.
const DEFAULT_BUCKETS: u64 = 10;

struct File<'a> {
    path: &'a Path,
}

impl File<'_> {
    fn err(&self, line: usize, message: impl Into<String>) -> ConfigError {
        ConfigError::at(self.path, line, message)
    }

    /// A map's pairs with string keys; refuses non-string and unknown keys
    /// (as the reference) and keys given twice (yaml.v2 keeps the last
    /// silently; we refuse, since one of the two is a mistake). Merge keys
    /// (`<<: *anchor`) are expanded as yaml.v2 does: in order, a later key
    /// replacing an earlier one, earlier maps first in a merged list.
    fn pairs<'n>(
        &self,
        node: &'n Node,
        extra: &[&str],
    ) -> Result<Vec<(&'n str, &'n Node, usize)>, ConfigError> {
        let mut out: Vec<(&str, &Node, usize, bool)> = Vec::new();
        self.flatten(node, extra, &mut out, 0)?;
        Ok(out.into_iter().map(|(n, v, l, _)| (n, v, l)).collect())
    }

    fn flatten<'n>(
        &self,
        node: &'n Node,
        extra: &[&str],
        out: &mut Vec<(&'n str, &'n Node, usize, bool)>,
        depth: usize,
    ) -> Result<(), ConfigError> {
        let Value::Map(pairs) = &node.value else {
            return Err(self.err(
                node.line,
                format!("expected a map, found {}", node.describe()),
            ));
        };
        // Merges of merges deeper than this are refused rather than
        // followed (aliases cannot loop, but they can nest).
        if depth > 32 {
            return Err(self.err(node.line, "merge keys nested too deep"));
        }
        for (k, v) in pairs {
            if matches!(&k.value, Value::Scalar { text, plain: true } if text == "<<") {
                let maps: Vec<&Node> = match &v.value {
                    Value::Map(_) => vec![v],
                    Value::Seq(items) => items.iter().rev().collect(),
                    Value::Scalar { .. } => vec![v],
                };
                for m in maps {
                    if !matches!(m.value, Value::Map(_)) {
                        return Err(self.err(
                            m.line,
                            "map merge requires map or sequence of maps as the value",
                        ));
                    }
                    self.flatten(m, extra, out, depth + 1)?;
                }
                continue;
            }
            let name = match k.resolve() {
                Some(Resolved::Str(s)) => s,
                _ => {
                    return Err(self.err(
                        k.line,
                        format!("config error, key is not of type string: {}", k.describe()),
                    ))
                }
            };
            if !REFERENCE_KEYS.contains(&name) && !extra.contains(&name) {
                return Err(self.err(k.line, format!("config error, unknown key '{name}'")));
            }
            // The node's own keys are explicit; merged ones are not.
            let explicit = depth == 0;
            match out.iter_mut().find(|(n, _, _, _)| *n == name) {
                Some((_, _, _, true)) if explicit => {
                    return Err(self.err(k.line, format!("duplicate key '{name}'")));
                }
                Some(slot) => *slot = (name, v, k.line, slot.3 || explicit),
                None => out.push((name, v, k.line, explicit)),
            }
        }
        Ok(())
    }

    /// Checks a value the reference validates but does not read (a valid key
    /// in the wrong place): keys known, lists made of maps.
    fn check_ignored(&self, node: &Node) -> Result<(), ConfigError> {
        match &node.value {
            Value::Scalar { .. } => Ok(()),
            Value::Map(_) => {
                for (_, v, _) in self.pairs(node, &[])? {
                    self.check_ignored(v)?;
                }
                Ok(())
            }
            Value::Seq(items) => {
                for item in items {
                    self.list_map(item)?;
                    self.check_ignored(item)?;
                }
                Ok(())
            }
        }
    }

    /// A list element must be a map (the reference's message).
    fn list_map(&self, item: &Node) -> Result<(), ConfigError> {
        match item.value {
            Value::Map(_) => Ok(()),
            _ => Err(self.err(
                item.line,
                format!(
                    "config error, yaml file contains list of type other than map: {}",
                    item.describe()
                ),
            )),
        }
    }

    /// A list of maps; null is an empty list.
    fn list<'n>(&self, node: &'n Node, what: &str) -> Result<&'n [Node], ConfigError> {
        if node.is_null() {
            return Ok(&[]);
        }
        let Value::Seq(items) = &node.value else {
            return Err(self.err(
                node.line,
                format!("{what} must be a list, found {}", node.describe()),
            ));
        };
        for item in items {
            self.list_map(item)?;
        }
        Ok(items)
    }

    /// A string field: any scalar's text (yaml.v2 decodes `10` into a string
    /// as "10"); null is "".
    fn string(&self, node: &Node, what: &str) -> Result<String, ConfigError> {
        match (&node.value, node.resolve()) {
            (_, Some(Resolved::Null)) => Ok(String::new()),
            (Value::Scalar { text, .. }, _) => Ok(text.clone()),
            _ => Err(self.err(
                node.line,
                format!("{what} must be a string, found {}", node.describe()),
            )),
        }
    }

    /// A boolean field (YAML 1.1 spellings, as yaml.v2); null is false.
    fn boolean(&self, node: &Node, what: &str) -> Result<bool, ConfigError> {
        match node.resolve() {
            Some(Resolved::Null) => Ok(false),
            Some(Resolved::Bool(b)) => Ok(b),
            _ => Err(self.err(
                node.line,
                format!("{what} must be true or false, found {}", node.describe()),
            )),
        }
    }

    /// An unsigned integer field within [min, max].
    fn integer(&self, node: &Node, what: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
        match node.resolve() {
            Some(Resolved::Int(n)) if n >= i128::from(min) && n <= i128::from(max) => Ok(n as u64),
            _ => Err(self.err(
                node.line,
                format!(
                    "{what} must be an integer from {min} to {max}, found {}",
                    node.describe()
                ),
            )),
        }
    }
}

pub(super) fn load_file(
    config: &mut Config,
    path: &Path,
    text: &str,
    merge_domains: bool,
) -> Result<(), ConfigError> {
    let file = File { path };
    let root = match yaml::parse(text) {
        Ok(root) => root,
        Err(e) => {
            return Err(file.err(e.line, format!("error loading config file: {}", e.message)));
        }
    };
    // An empty file is an empty map to yaml.v2: no domain.
    let root = match root {
        Some(node) if !node.is_null() => node,
        _ => return Err(file.err(1, "config file cannot have empty domain")),
    };
    let mut domain = String::new();
    let mut domain_line = root.line;
    let mut descriptors: &[Node] = &[];
    for (name, value, _) in file.pairs(&root, &[])? {
        match name {
            "domain" => {
                domain = file.string(value, "domain")?;
                domain_line = value.line;
            }
            "descriptors" => descriptors = file.list(value, "descriptors")?,
            _ => file.check_ignored(value)?,
        }
    }
    if domain.is_empty() {
        return Err(file.err(domain_line, "config file cannot have empty domain"));
    }
    let parent_key = format!("{domain}.");
    if let Some(level) = config.domains.get_mut(&domain) {
        if !merge_domains {
            return Err(file.err(
                domain_line,
                format!("duplicate domain '{domain}' in config file"),
            ));
        }
        return load_descriptors(&file, level, &parent_key, descriptors);
    }
    let mut level = Level::default();
    load_descriptors(&file, &mut level, &parent_key, descriptors)?;
    config.domains.insert(domain, level);
    Ok(())
}

fn load_descriptors(
    file: &File<'_>,
    level: &mut Level,
    parent_key: &str,
    descriptors: &[Node],
) -> Result<(), ConfigError> {
    for node in descriptors {
        let mut key = String::new();
        let mut value = String::new();
        let mut rate_limit: Option<&Node> = None;
        let mut children: &[Node] = &[];
        let mut shadow_mode = false;
        let mut quota_mode = false;
        let mut detailed_metric = false;
        let mut value_to_metric = false;
        let mut share_threshold = false;
        for (name, v, _) in file.pairs(node, &[])? {
            match name {
                "key" => key = file.string(v, "key")?,
                "value" => value = file.string(v, "value")?,
                // `rate_limit:` with nothing is no rate limit (a nil pointer
                // to the reference).
                "rate_limit" if v.is_null() => {}
                "rate_limit" => rate_limit = Some(v),
                "descriptors" => children = file.list(v, "descriptors")?,
                "shadow_mode" => shadow_mode = file.boolean(v, "shadow_mode")?,
                "quota_mode" => quota_mode = file.boolean(v, "quota_mode")?,
                "detailed_metric" => detailed_metric = file.boolean(v, "detailed_metric")?,
                "value_to_metric" => value_to_metric = file.boolean(v, "value_to_metric")?,
                "share_threshold" => share_threshold = file.boolean(v, "share_threshold")?,
                _ => file.check_ignored(v)?,
            }
        }
        if key.is_empty() {
            return Err(file.err(node.line, "descriptor has empty key"));
        }
        let mut composite = key;
        if !value.is_empty() {
            composite.push('_');
            composite.push_str(&value);
        }
        let full_key = format!("{parent_key}{composite}");
        if level.children.contains_key(&composite) {
            return Err(file.err(
                node.line,
                format!("duplicate descriptor composite key '{full_key}'"),
            ));
        }
        let rule = match rate_limit {
            None => None,
            Some(v) => Some(load_rule(
                file,
                v,
                full_key.clone(),
                shadow_mode,
                quota_mode,
                detailed_metric,
            )?),
        };
        let wildcard = composite.ends_with('*');
        if share_threshold && !wildcard {
            return Err(file.err(
                node.line,
                format!(
                    "share_threshold can only be used with wildcard values (ending with '*'), but found key '{composite}'"
                ),
            ));
        }
        let mut descriptor = Descriptor {
            rule,
            value_to_metric,
            share_pattern: share_threshold.then(|| composite.clone()),
            level: Level::default(),
        };
        load_descriptors(
            file,
            &mut descriptor.level,
            &format!("{full_key}."),
            children,
        )?;
        if wildcard {
            level.wildcards.push(composite.clone());
        }
        level.order.push(composite.clone());
        level.children.insert(composite, descriptor);
    }
    Ok(())
}

fn load_rule(
    file: &File<'_>,
    node: &Node,
    full_key: String,
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
) -> Result<Rule, ConfigError> {
    let mut rule = Rule {
        full_key,
        limits: Arc::from([]),
        unlimited: false,
        written_requests_per_unit: 0,
        shadow_mode,
        quota_mode,
        name: None,
        replaces: Vec::new(),
        detailed_metric,
    };
    if let Value::Seq(items) = &node.value {
        // Our extension: several limits on one descriptor.
        if items.is_empty() {
            return Err(file.err(node.line, "rate_limit: an empty list of limits"));
        }
        let mut limits = Vec::with_capacity(items.len());
        for item in items {
            file.list_map(item)?;
            let parsed = parse_limit_map(file, item)?;
            for (what, line) in [
                ("unlimited", parsed.unlimited_line),
                ("name", parsed.name_line),
                ("replaces", parsed.replaces_line),
            ] {
                if let Some(line) = line {
                    return Err(file.err(
                        line,
                        format!("'{what}' is refused in a list of limits (write a single rate_limit map)"),
                    ));
                }
            }
            limits.push(parsed.limit(file, item.line)?);
        }
        rule.limits = Arc::from(limits);
        return Ok(rule);
    }
    let parsed = parse_limit_map(file, node)?;
    rule.name = parsed.name.clone().filter(|n| !n.is_empty());
    for (name, line) in &parsed.replaces {
        if name.is_empty() {
            return Err(file.err(*line, "should not have an empty replaces entry"));
        }
        // The reference compares with the name as written, "" included.
        if *name == parsed.name.clone().unwrap_or_default() {
            return Err(file.err(*line, "replaces should not contain name of same descriptor"));
        }
    }
    rule.replaces = parsed.replaces.iter().map(|(n, _)| n.clone()).collect();
    if parsed.unlimited {
        if let Some((_, line)) = parsed
            .unit
            .as_ref()
            .filter(|(u, _)| Unit::parse(u).is_some())
        {
            return Err(file.err(*line, "should not specify rate limit unit when unlimited"));
        }
        if let Some((what, line)) = parsed.extensions.first() {
            return Err(file.err(*line, format!("should not specify {what} when unlimited")));
        }
        rule.unlimited = true;
        rule.written_requests_per_unit = parsed.requests_per_unit.map_or(0, |(n, _)| n as u32);
        return Ok(rule);
    }
    rule.limits = Arc::from([parsed.limit(file, node.line)?]);
    Ok(rule)
}

/// The fields of one `rate_limit` map, before the checks that depend on
/// where it is.
#[derive(Default)]
struct LimitFields {
    unit: Option<(String, usize)>,
    requests_per_unit: Option<(u64, usize)>,
    unlimited: bool,
    unlimited_line: Option<usize>,
    name: Option<String>,
    name_line: Option<usize>,
    replaces: Vec<(String, usize)>,
    replaces_line: Option<usize>,
    algorithm: Option<(String, usize)>,
    unit_multiplier: Option<(u64, usize)>,
    burst: Option<(u64, usize)>,
    buckets: Option<(u64, usize)>,
    /// Extension keys given, with their lines, in file order.
    extensions: Vec<(&'static str, usize)>,
}

fn parse_limit_map(file: &File<'_>, node: &Node) -> Result<LimitFields, ConfigError> {
    let mut f = LimitFields::default();
    for (name, v, key_line) in file.pairs(node, EXTENSION_KEYS)? {
        match name {
            "unit" => f.unit = Some((file.string(v, "unit")?, v.line)),
            "requests_per_unit" if v.is_null() => {}
            "requests_per_unit" => {
                let n = file.integer(v, "requests_per_unit", 0, u64::from(u32::MAX))?;
                f.requests_per_unit = Some((n, v.line));
            }
            "unlimited" => {
                f.unlimited = file.boolean(v, "unlimited")?;
                f.unlimited_line = Some(key_line);
            }
            "name" => {
                f.name = Some(file.string(v, "name")?);
                f.name_line = Some(key_line);
            }
            "replaces" => {
                f.replaces_line = Some(key_line);
                for item in file.list(v, "replaces")? {
                    let mut entry = String::new();
                    for (k, value, _) in file.pairs(item, &[])? {
                        match k {
                            "name" => entry = file.string(value, "name")?,
                            _ => file.check_ignored(value)?,
                        }
                    }
                    f.replaces.push((entry, item.line));
                }
            }
            "algorithm" => {
                f.algorithm = Some((file.string(v, "algorithm")?, v.line));
                f.extensions.push(("algorithm", key_line));
            }
            "unit_multiplier" => {
                let n = file.integer(v, "unit_multiplier", 1, u64::from(u32::MAX))?;
                f.unit_multiplier = Some((n, v.line));
                f.extensions.push(("unit_multiplier", key_line));
            }
            "burst" => {
                f.burst = Some((file.integer(v, "burst", 1, u64::MAX)?, v.line));
                f.extensions.push(("burst", key_line));
            }
            "buckets" => {
                f.buckets = Some((file.integer(v, "buckets", 1, u64::MAX)?, v.line));
                f.extensions.push(("buckets", key_line));
            }
            _ => file.check_ignored(v)?,
        }
    }
    Ok(f)
}

impl LimitFields {
    /// The limit these fields describe; `line` is the map's, for what is
    /// missing.
    fn limit(&self, file: &File<'_>, line: usize) -> Result<Limit, ConfigError> {
        let (unit_text, unit_line) = self.unit.clone().unwrap_or_else(|| (String::new(), line));
        let Some(unit) = Unit::parse(&unit_text) else {
            return Err(file.err(unit_line, format!("invalid rate limit unit '{unit_text}'")));
        };
        let Some((requests_per_unit, rpu_line)) = self.requests_per_unit else {
            return Err(file.err(
                line,
                "rate_limit needs requests_per_unit (0 denies every request)",
            ));
        };
        let requests_per_unit = requests_per_unit as u32;
        let unit_multiplier = self.unit_multiplier.map_or(1, |(n, _)| n as u32);
        let period_ms = (unit.seconds() * 1000).saturating_mul(u64::from(unit_multiplier));
        if period_ms > i64::MAX as u64 {
            let l = self.unit_multiplier.map_or(line, |(_, l)| l);
            return Err(file.err(l, "unit_multiplier makes a period longer than i64::MAX ms"));
        }
        let (name, name_line) = self
            .algorithm
            .clone()
            .unwrap_or_else(|| ("fixed_window".to_string(), line));
        let algorithm = match name.as_str() {
            "fixed_window" => Algorithm::FixedWindow,
            "sliding_window" => Algorithm::SlidingWindow,
            "token_bucket" => Algorithm::TokenBucket {
                burst: self
                    .burst
                    .map_or(u64::from(requests_per_unit), |(b, _)| b),
            },
            "hash_window" => {
                let (buckets, buckets_line) = self.buckets.unwrap_or((DEFAULT_BUCKETS, line));
                if period_ms % buckets != 0 {
                    return Err(file.err(
                        buckets_line,
                        format!(
                            "buckets {buckets} does not divide the period of {period_ms} ms"
                        ),
                    ));
                }
                Algorithm::HashWindow { buckets }
            }
            other => {
                return Err(file.err(
                    name_line,
                    format!(
                        "unknown algorithm '{other}' (fixed_window, sliding_window, token_bucket or hash_window)"
                    ),
                ))
            }
        };
        if let (Some((_, l)), false) = (
            self.burst,
            matches!(algorithm, Algorithm::TokenBucket { .. }),
        ) {
            return Err(file.err(l, format!("burst applies to token_bucket only, not {name}")));
        }
        if let (Some((_, l)), false) = (
            self.buckets,
            matches!(algorithm, Algorithm::HashWindow { .. }),
        ) {
            return Err(file.err(
                l,
                format!("buckets applies to hash_window only, not {name}"),
            ));
        }
        // The reference's fixed window takes 0 as "deny everything"; the
        // module's other algorithms need at least one request per period.
        if requests_per_unit == 0 && algorithm != Algorithm::FixedWindow {
            return Err(file.err(
                rpu_line,
                format!("requests_per_unit must be at least 1 with {name}"),
            ));
        }
        Ok(Limit {
            unit,
            requests_per_unit,
            unit_multiplier,
            algorithm,
        })
    }
}
