//! `fgpu top`: rendered in a terminal (tmux), and without one.

use super::*;

#[test]
fn top_renders_in_a_terminal_and_quits_on_q() {
    let Some(tmux) = Tmux::new("top") else { return };
    let env = Env::new("cli-top").context_overhead("100M");
    let mut holder = env.client(&["init", "primary", "alloc", "400M", "hold"]).shim().limit("2G").spawn();
    holder.wait_for("holding");
    let ledger = env.ledger.display().to_string();
    tmux.start(&format!("{} {} top --ledger {ledger}; echo TOP-EXITED rc=$?; sleep 60", env_prefix(&env, &[]), fgpu_bin().display()));
    let screen = tmux.wait_screen(&holder.pid().to_string(), Duration::from_secs(10));
    assert!(screen.contains("fgpu top"), "{screen}");
    assert!(screen.contains("of 2 GiB cap"), "{screen}");
    assert!(screen.contains("GPU 0"), "{screen}");
    assert!(screen.contains("cuclient"), "{screen}");
    // It refreshes: a second holder appears without a key press.
    let mut second = env.client(&["init", "primary", "alloc", "100M", "hold"]).shim().limit("2G").spawn();
    second.wait_for("holding");
    tmux.wait_screen(&second.pid().to_string(), Duration::from_secs(5));
    tmux.keys(&["q"]);
    let screen = tmux.wait_screen("TOP-EXITED rc=0", Duration::from_secs(5));
    assert!(!screen.contains("fgpu top"), "the alternate screen is left on exit:\n{screen}");
    holder.finish();
    second.finish();
}

#[test]
fn top_without_a_terminal_says_so() {
    let env = Env::new("cli-top-notty");
    let run = fgpu(&env).args(["top"]).run();
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    assert!(run.stderr().contains("needs a terminal"), "{run}");
}
