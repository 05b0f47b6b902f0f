//! `fgpu top`: `fgpu status`, refreshed in the terminal's alternate screen until `q`.

use super::args::TopArgs;
use crate::observe::ledgers;
use crate::observe::report::{self, StatusReport};
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::{cursor, execute, queue, style, terminal};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static STOP: AtomicBool = AtomicBool::new(false);

/// Runs inside the signal handler: an atomic store only.
fn on_stop(_signal: i32, _si_code: i32) {
    STOP.store(true, Ordering::SeqCst);
}

/// What a key press means.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Quit,
    Refresh,
    Nothing,
}

pub fn action_for(key: &KeyEvent) -> Action {
    if key.kind == KeyEventKind::Release {
        return Action::Nothing;
    }
    match key.code {
        KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc => Action::Quit,
        KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => Action::Quit,
        KeyCode::Char(' ') | KeyCode::Char('r') => Action::Refresh,
        _ => Action::Nothing,
    }
}

/// The screen: a title line, then the status text, cut to the terminal's size.
pub fn screen(report: &StatusReport, width: usize, height: usize, clock: &str, interval: f64) -> Vec<String> {
    let mut lines = vec![format!("fgpu top  {clock}  every {interval}s  q: quit")];
    lines.push(String::new());
    for note in &report.notes {
        lines.push(format!("note: {note}"));
    }
    lines.extend(crate::observe::text::render_text(report, width).lines().map(String::from));
    lines.truncate(height.max(1));
    lines.into_iter().map(|l| l.chars().take(width).collect()).collect()
}

fn clock() -> String {
    let (hour, minute, second) = fgpu_core::sys::host::local_time_of_day();
    format!("{hour:02}:{minute:02}:{second:02}")
}

/// Puts the terminal back however `top` ends (return, error, panic).
struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> std::io::Result<TerminalGuard> {
        terminal::enable_raw_mode()?;
        let guard = TerminalGuard;
        execute!(std::io::stdout(), terminal::EnterAlternateScreen, cursor::Hide)?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let _ = execute!(std::io::stdout(), cursor::Show, terminal::LeaveAlternateScreen);
        let _ = terminal::disable_raw_mode();
    }
}

fn draw(lines: &[String]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    queue!(out, cursor::MoveTo(0, 0), terminal::Clear(terminal::ClearType::All))?;
    for (row, line) in lines.iter().enumerate() {
        queue!(out, cursor::MoveTo(0, row as u16), style::Print(line))?;
    }
    out.flush()
}

pub fn top(args: &TopArgs) -> i32 {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        eprintln!("fgpu top: needs a terminal; use `fgpu status` (or `fgpu status --json`) in scripts");
        return 1;
    }
    for signal in [libc::SIGTERM, libc::SIGHUP] {
        let _ = fgpu_core::sys::signals::handle(signal, on_stop, true);
    }
    let guard = match TerminalGuard::enter() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("fgpu top: cannot set up the terminal: {e}");
            return 1;
        }
    };
    let interval = Duration::from_secs_f64(args.interval);
    let result = (|| -> std::io::Result<()> {
        loop {
            let report = report::collect(ledgers::resolve_with_runs(&args.select));
            let (w, h) = terminal::size().unwrap_or((100, 30));
            draw(&screen(&report, w as usize, h as usize, &clock(), args.interval))?;
            let next = Instant::now() + interval;
            loop {
                if STOP.load(Ordering::SeqCst) {
                    return Ok(());
                }
                let left = next.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                if event::poll(left.min(Duration::from_millis(200)))? {
                    match event::read()? {
                        Event::Key(key) => match action_for(&key) {
                            Action::Quit => return Ok(()),
                            Action::Refresh => break,
                            Action::Nothing => {}
                        },
                        Event::Resize(..) => break,
                        _ => {}
                    }
                }
            }
        }
    })();
    drop(guard);
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("fgpu top: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        let key = |code, modifiers| KeyEvent::new(code, modifiers);
        assert_eq!(action_for(&key(KeyCode::Char('q'), KeyModifiers::NONE)), Action::Quit);
        assert_eq!(action_for(&key(KeyCode::Esc, KeyModifiers::NONE)), Action::Quit);
        assert_eq!(action_for(&key(KeyCode::Char('c'), KeyModifiers::CONTROL)), Action::Quit);
        assert_eq!(action_for(&key(KeyCode::Char('c'), KeyModifiers::NONE)), Action::Nothing);
        assert_eq!(action_for(&key(KeyCode::Char(' '), KeyModifiers::NONE)), Action::Refresh);
    }

    #[test]
    fn screen_fits_the_terminal() {
        let report = StatusReport { schema: 1, ledgers: vec![], notes: vec!["a note".into()], gpus: vec![] };
        let lines = screen(&report, 20, 2, "12:00:00", 1.0);
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|l| l.chars().count() <= 20));
        assert!(lines[0].starts_with("fgpu top"));
    }
}
