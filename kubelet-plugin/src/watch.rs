//! Watches this node's slices of this driver, so that a slice deleted or changed by someone
//! else is put back within seconds. kubelet deletes every slice of its node when it starts,
//! and a driver's slices 30 s after its plugin deregisters (a plugin restarting, for one);
//! without a watch they would stay gone until the next periodic look.
//!
//! A watch can be cut, or end without a word; it is started again (after a list, which
//! also catches what happened meanwhile), with a growing pause after failures. The periodic
//! look of [`crate::publish`] stays, for whatever a cut watch missed.

use crate::api::Api;
use crate::publish::Publisher;
use crate::status::Status;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Watches until the process ends; `kick` wakes the publisher.
pub async fn run(api: Arc<Api>, publisher: Arc<Publisher>, node: String, kick: Arc<Notify>, status: Arc<Status>) {
    let mut pause = Duration::from_secs(1);
    let mut said_broken = false;
    loop {
        let version = match api.list_slices(&node).await {
            Ok((_, version)) => version,
            Err(e) => {
                if !said_broken {
                    crate::log(&format!("cannot watch the ResourceSlices (list: {e}); the periodic look goes on"));
                    said_broken = true;
                }
                status.update(|s| s.watch = format!("not watching: {e}"));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        // What happened while there was no watch.
        kick.notify_one();
        status.update(|s| s.watch = "watching".into());
        let began = std::time::Instant::now();
        let outcome = api
            .watch_slices(&node, &version, |event| {
                let rv = event.object.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()).unwrap_or_default();
                let news = match event.kind.as_str() {
                    "DELETED" => true,
                    "ADDED" | "MODIFIED" => !publisher.is_own(rv),
                    _ => false,
                };
                if news {
                    kick.notify_one();
                }
            })
            .await;
        match outcome {
            Ok(()) if began.elapsed() >= Duration::from_secs(5) => {
                pause = Duration::from_secs(1);
                said_broken = false;
            }
            // A watch the server ends at once: no faster than the pause.
            Ok(()) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
            Err(e) => {
                if !said_broken {
                    crate::log(&format!("the watch of the ResourceSlices stopped ({e}); starting it again"));
                    said_broken = true;
                }
                status.update(|s| s.watch = format!("restarting: {e}"));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    }
}
