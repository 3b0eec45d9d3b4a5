//! The configuration folder, as envoyproxy/ratelimit reads it through
//! lyft/goruntime: every file under
//! RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, subfolders
//! included, whatever its name ends with; names starting with `.` skipped
//! (files and folders) only with RUNTIME_IGNOREDOTFILES. Symbolic links to
//! files are read; links to folders are not walked (goruntime's walk does
//! not follow them either), except the app folder itself. Next to the app
//! folder, entries named `<app>.*` (`config.yaml`, `config.d/`) are read
//! too, as goruntime's keys for them start with `config.` like the app
//! folder's.
//!
//! Reloads are polled, not notified: each poll resolves RUNTIME_ROOT's
//! links afresh, so swapping the link (the reference's way to publish a new
//! version) is seen, and a whole version is read through its resolved path,
//! never half of one and half of the next.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::{Config, ConfigError};

/// Where the configuration files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeDir {
    /// RUNTIME_ROOT, often a symbolic link swapped to publish a version.
    pub root: PathBuf,
    /// RUNTIME_SUBDIRECTORY (may be empty).
    pub subdirectory: String,
    /// RUNTIME_APPDIRECTORY (the reference's default: `config`).
    pub appdirectory: String,
    /// RUNTIME_IGNOREDOTFILES.
    pub ignore_dot_files: bool,
}

impl RuntimeDir {
    /// root/subdirectory/appdirectory, empty parts left out (as Go's
    /// `filepath.Join`, which also keeps a part's leading `/` from
    /// restarting the path).
    pub fn config_dir(&self) -> PathBuf {
        let mut dir = self.root.clone();
        for part in [&self.subdirectory, &self.appdirectory] {
            let part = part.trim_start_matches('/');
            if !part.is_empty() {
                dir.push(part);
            }
        }
        dir
    }
}

/// Every file of the configuration folder, sorted by path: (path as under
/// [`RuntimeDir::config_dir`], contents). A missing or unreadable folder,
/// or a file that cannot be read or is not UTF-8, is an error naming it.
pub fn read(dir: &RuntimeDir) -> Result<Vec<(PathBuf, String)>, ConfigError> {
    read_resolved(dir).map(|(_, files)| files)
}

/// [`read`], with the folder's resolved path (what a link swap changes).
fn read_resolved(dir: &RuntimeDir) -> Result<(PathBuf, Vec<(PathBuf, String)>), ConfigError> {
    let shown = dir.config_dir();
    let app = dir.appdirectory.trim_matches('/');
    let (shown_parent, app) = match shown.parent() {
        Some(parent) if !app.is_empty() && !app.contains('/') => (parent.to_path_buf(), app),
        _ => {
            let resolved = fs::canonicalize(&shown)
                .map_err(|e| io_error(&shown, "configuration folder", &e))?;
            let mut files = Vec::new();
            walk(&resolved, &shown, dir.ignore_dot_files, &mut files)?;
            files.sort_by(|a, b| a.0.cmp(&b.0));
            return Ok((resolved, files));
        }
    };
    // Resolve the folder above the app folder: goruntime walks it and keeps
    // what its key (the path below it, `/` made `.`) starts `config.` with,
    // so next to the config folder a `config.yaml` file (or a `config.d/`
    // folder) is loaded too.
    let resolved = fs::canonicalize(&shown_parent)
        .map_err(|e| io_error(&shown, "configuration folder", &e))?;
    let mut files = Vec::new();
    let mut found = false;
    let entries =
        fs::read_dir(&resolved).map_err(|e| io_error(&shown, "configuration folder", &e))?;
    let prefix = format!("{app}.");
    for entry in entries {
        let entry = entry.map_err(|e| io_error(&shown, "configuration folder", &e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == app {
            let real = entry.path();
            if fs::metadata(&real).is_ok_and(|m| m.is_dir()) {
                found = true;
                walk(&real, &shown, dir.ignore_dot_files, &mut files)?;
            }
        } else if name.starts_with(&prefix) {
            found = true;
            visit(&entry, &shown_parent, dir.ignore_dot_files, &mut files)?;
        }
    }
    if !found {
        let e = io::Error::from(io::ErrorKind::NotFound);
        return Err(io_error(&shown, "configuration folder", &e));
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((resolved, files))
}

fn io_error(path: &Path, what: &str, e: &io::Error) -> ConfigError {
    ConfigError {
        path: path.to_path_buf(),
        line: None,
        message: format!("cannot read the {what}: {e}"),
    }
}

/// Reads `real` (a resolved folder) into `out`, naming files under `shown`.
fn walk(
    real: &Path,
    shown: &Path,
    ignore_dot_files: bool,
    out: &mut Vec<(PathBuf, String)>,
) -> Result<(), ConfigError> {
    let entries = fs::read_dir(real).map_err(|e| io_error(shown, "configuration folder", &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error(shown, "configuration folder", &e))?;
        visit(&entry, shown, ignore_dot_files, out)?;
    }
    Ok(())
}

/// Reads one entry of a folder shown as `shown`: a file, or a folder
/// walked.
fn visit(
    entry: &fs::DirEntry,
    shown: &Path,
    ignore_dot_files: bool,
    out: &mut Vec<(PathBuf, String)>,
) -> Result<(), ConfigError> {
    let name = entry.file_name();
    let shown_path = shown.join(&name);
    if ignore_dot_files && name.to_string_lossy().starts_with('.') {
        return Ok(());
    }
    let real_path = entry.path();
    let link = entry
        .file_type()
        .map_err(|e| io_error(&shown_path, "file", &e))?
        .is_symlink();
    // A dangling link is skipped, as goruntime skips a file it cannot read
    // (it logs it and loads the rest).
    let Ok(meta) = fs::metadata(&real_path) else {
        return Ok(());
    };
    if meta.is_dir() {
        if !link {
            walk(&real_path, &shown_path, ignore_dot_files, out)?;
        }
        return Ok(());
    }
    let bytes = fs::read(&real_path).map_err(|e| io_error(&shown_path, "file", &e))?;
    let text = String::from_utf8(bytes).map_err(|_| ConfigError {
        path: shown_path.clone(),
        line: None,
        message: "error loading config file: not UTF-8 text".to_string(),
    })?;
    out.push((shown_path, text));
    Ok(())
}

/// Stops its polling thread when dropped.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// What a poll saw: the resolved folder and every file's contents, or the
/// error's text. Two equal states need no reload.
#[derive(PartialEq)]
enum State {
    Files(PathBuf, Vec<(PathBuf, String)>),
    Failed(String),
}

type Polled = Result<(PathBuf, Vec<(PathBuf, String)>), ConfigError>;

fn state(polled: &Polled) -> State {
    match polled {
        Ok((resolved, files)) => State::Files(resolved.clone(), files.clone()),
        Err(e) => State::Failed(e.to_string()),
    }
}

/// Polls the folder every `every` on a thread of its own and calls
/// `on_change` with the new configuration, or the error, whenever what it
/// reads differs from what it last reported: a file added, removed or
/// changed, or RUNTIME_ROOT resolving elsewhere (a link swap, even to
/// identical files). A change is reported once two consecutive polls see
/// it (so within two periods), never a file caught half-written. The first
/// comparison is against the folder as it is when `watch` is called, so
/// call it right after loading the initial configuration. A failure is
/// reported once, not at every poll, and again only after the folder
/// changes. Dropping the returned [`Watcher`] stops
/// the thread.
pub fn watch(
    dir: RuntimeDir,
    merge_domains: bool,
    every: Duration,
    on_change: impl Fn(Result<Config, ConfigError>) + Send + 'static,
) -> Watcher {
    let stop = Arc::new(AtomicBool::new(false));
    let mut reported = state(&read_resolved(&dir));
    let mut pending: Option<State> = None;
    let thread_stop = stop.clone();
    let thread = thread::Builder::new()
        .name("rls-config-watch".to_string())
        .spawn(move || loop {
            // A spurious wake-up only polls early.
            thread::park_timeout(every);
            if thread_stop.load(Ordering::SeqCst) {
                return;
            }
            let polled = read_resolved(&dir);
            let now = state(&polled);
            if now == reported {
                pending = None;
                continue;
            }
            // A change is acted on once two polls in a row agree, so that a
            // file caught half-written is not reported as an error.
            if pending.as_ref() != Some(&now) {
                pending = Some(now);
                continue;
            }
            pending = None;
            reported = now;
            on_change(polled.and_then(|(_, files)| Config::load(&files, merge_domains)));
        });
    Watcher {
        stop,
        // Without a thread (the system refused one) nothing is watched; the
        // configuration loaded at start stays.
        thread: thread.ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;

    /// A fresh folder under the system's temporary folder, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let path = std::env::temp_dir().join(format!(
                "rls-config-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn limit_file(domain: &str, requests_per_unit: u32) -> String {
        format!(
            "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: {requests_per_unit}\n"
        )
    }

    /// Writes a file in one rename (through a dot file, which the watched
    /// folders ignore).
    fn write(path: &Path, text: &str) {
        let parent = path.parent().unwrap();
        fs::create_dir_all(parent).unwrap();
        let tmp = parent.join(format!(
            ".{}.tmp",
            path.file_name().unwrap().to_string_lossy()
        ));
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, path).unwrap();
    }

    fn rpu(config: &Config, domain: &str) -> u32 {
        config.get_limit(domain, &[("k", "v")]).unwrap().limits[0].requests_per_unit
    }

    /// Points `link` at `target` in one rename, as deployments swap
    /// RUNTIME_ROOT.
    fn swap(link: &Path, target: &Path) {
        let tmp = link.with_extension("tmp");
        let _ = fs::remove_file(&tmp);
        symlink(target, &tmp).unwrap();
        fs::rename(&tmp, link).unwrap();
    }

    fn dir(root: &Path, sub: &str, app: &str, ignore_dot_files: bool) -> RuntimeDir {
        RuntimeDir {
            root: root.to_path_buf(),
            subdirectory: sub.to_string(),
            appdirectory: app.to_string(),
            ignore_dot_files,
        }
    }

    /// Waits for the watcher's next report. The bound only keeps a broken
    /// watcher from hanging the test run.
    fn next(rx: &mpsc::Receiver<Result<Config, ConfigError>>) -> Result<Config, ConfigError> {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the watcher reported nothing")
    }

    #[test]
    fn config_dir_joins_as_go() {
        assert_eq!(
            dir(Path::new("/srv/current"), "", "config", false).config_dir(),
            PathBuf::from("/srv/current/config")
        );
        assert_eq!(
            dir(Path::new("/srv/current"), "ratelimit", "config", false).config_dir(),
            PathBuf::from("/srv/current/ratelimit/config")
        );
        assert_eq!(
            dir(Path::new("/srv/current"), "/rl", "", false).config_dir(),
            PathBuf::from("/srv/current/rl")
        );
    }

    #[test]
    fn read_takes_every_file_of_the_tree_sorted() {
        let tmp = TempDir::new();
        let config = tmp.0.join("root/rl/config");
        write(&config.join("b.yaml"), &limit_file("b", 2));
        write(&config.join("a.yml"), &limit_file("a", 1));
        write(&config.join("sub/c.conf"), &limit_file("c", 3));
        write(&config.join(".hidden.yaml"), &limit_file("h", 4));
        write(&config.join(".git/x.yaml"), &limit_file("x", 5));
        write(&tmp.0.join("elsewhere/linked.yaml"), &limit_file("l", 6));
        symlink(
            tmp.0.join("elsewhere/linked.yaml"),
            config.join("linked.yaml"),
        )
        .unwrap();
        symlink(tmp.0.join("elsewhere"), config.join("linked-dir")).unwrap();
        symlink(tmp.0.join("nowhere"), config.join("dangling.yaml")).unwrap();
        // Beside the app folder: `config.*` entries are goruntime's too.
        write(
            &tmp.0.join("root/rl/config.extra.yaml"),
            &limit_file("e", 7),
        );
        write(&tmp.0.join("root/rl/config.d/f.yaml"), &limit_file("f", 8));
        write(&tmp.0.join("root/rl/configuration.yaml"), "not loaded");
        write(&tmp.0.join("root/rl/other/g.yaml"), "not loaded");

        let names = |files: &[(PathBuf, String)]| -> Vec<String> {
            files
                .iter()
                .map(|(p, _)| {
                    p.strip_prefix(config.parent().unwrap())
                        .unwrap()
                        .display()
                        .to_string()
                })
                .collect()
        };
        let all = read(&dir(&tmp.0.join("root"), "rl", "config", false)).unwrap();
        assert_eq!(
            names(&all),
            [
                "config/.git/x.yaml",
                "config/.hidden.yaml",
                "config/a.yml",
                "config/b.yaml",
                "config/linked.yaml",
                "config/sub/c.conf",
                "config.d/f.yaml",
                "config.extra.yaml",
            ]
        );
        let visible = read(&dir(&tmp.0.join("root"), "rl", "config", true)).unwrap();
        assert_eq!(
            names(&visible),
            [
                "config/a.yml",
                "config/b.yaml",
                "config/linked.yaml",
                "config/sub/c.conf",
                "config.d/f.yaml",
                "config.extra.yaml",
            ]
        );
        let loaded = Config::load(&visible, false).unwrap();
        assert_eq!(loaded.domains(), 6);
        assert_eq!(rpu(&loaded, "c"), 3);
        assert_eq!(rpu(&loaded, "e"), 7);
    }

    #[test]
    fn read_refuses_a_missing_folder_and_binary_files() {
        let tmp = TempDir::new();
        let missing = dir(&tmp.0.join("nope"), "", "config", false);
        let e = read(&missing).unwrap_err();
        assert_eq!(e.path, tmp.0.join("nope/config"));
        assert!(
            e.message.contains("cannot read the configuration folder"),
            "{e}"
        );
        // The folder above exists, the app folder does not.
        let e = read(&dir(&tmp.0, "", "config", false)).unwrap_err();
        assert_eq!(e.path, tmp.0.join("config"));
        write(&tmp.0.join("config/ok.yaml"), &limit_file("a", 1));
        fs::write(tmp.0.join("config/bin.yaml"), [0xff, 0xfe, 0x00]).unwrap();
        let e = read(&dir(&tmp.0, "", "config", false)).unwrap_err();
        assert_eq!(e.path, tmp.0.join("config/bin.yaml"));
    }

    #[test]
    fn watch_sees_a_symlink_swap_an_edit_and_a_bad_file() {
        let tmp = TempDir::new();
        let v1 = tmp.0.join("v1");
        let v2 = tmp.0.join("v2");
        write(&v1.join("config/a.yaml"), &limit_file("d", 1));
        write(&v2.join("config/a.yaml"), &limit_file("d", 2));
        let current = tmp.0.join("current");
        swap(&current, &v1);
        let runtime = dir(&current, "", "config", true);
        assert_eq!(
            rpu(&Config::load(&read(&runtime).unwrap(), false).unwrap(), "d"),
            1
        );

        let (tx, rx) = mpsc::channel();
        let watcher = watch(runtime, false, Duration::from_millis(10), move |outcome| {
            let _ = tx.send(outcome);
        });

        swap(&current, &v2);
        assert_eq!(rpu(&next(&rx).unwrap(), "d"), 2);

        // A swap to identical files is still a new version.
        let v3 = tmp.0.join("v3");
        write(&v3.join("config/a.yaml"), &limit_file("d", 2));
        swap(&current, &v3);
        assert_eq!(rpu(&next(&rx).unwrap(), "d"), 2);

        // Edited in place.
        write(&v3.join("config/a.yaml"), &limit_file("d", 3));
        assert_eq!(rpu(&next(&rx).unwrap(), "d"), 3);

        // A bad file is reported with its path and line, once.
        write(&v3.join("config/b.yaml"), "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n");
        let e = next(&rx).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}:4: invalid rate limit unit 'fortnight'",
                current.join("config/b.yaml").display()
            )
        );

        // Fixed: the next report is the good configuration, not the error
        // again.
        write(&v3.join("config/b.yaml"), &limit_file("e", 9));
        let fixed = next(&rx).unwrap();
        assert_eq!(rpu(&fixed, "e"), 9);
        assert_eq!(rpu(&fixed, "d"), 3);

        // A vanished folder is an error; the swap back recovers.
        swap(&current, &tmp.0.join("gone"));
        assert!(next(&rx)
            .unwrap_err()
            .message
            .contains("cannot read the configuration folder"));
        swap(&current, &v1);
        assert_eq!(rpu(&next(&rx).unwrap(), "d"), 1);

        drop(watcher);
        // The thread is joined: its sender is gone.
        assert!(matches!(
            rx.recv_timeout(Duration::from_secs(60)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        ));
    }
}
