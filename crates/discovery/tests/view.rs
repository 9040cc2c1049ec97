//! The leader's view publication: what it sends, at once, and that it stops on shutdown.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fixed, info};
use egress_discovery::publish_view;
use egress_lease::testing::{Hooked, Hooks};
use egress_lease::{MemoryStore, SystemClock, ViewEntry};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Records each published view.
struct Recording {
    views: Mutex<Vec<Vec<ViewEntry>>>,
    published: Notify,
}

impl Hooks for Recording {
    fn published(&self, view: &[ViewEntry]) {
        self.views.lock().unwrap().push(view.to_vec());
        self.published.notify_one();
    }
}

#[tokio::test]
async fn the_view_is_published_at_once_and_the_publisher_stops_on_shutdown() {
    let store = Arc::new(Hooked {
        inner: MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900)),
        hooks: Recording {
            views: Mutex::default(),
            published: Notify::new(),
        },
    });
    let directory = Arc::new(Fixed::new(vec![
        info("crawl/b", true, 20, 3, &[("geo", "eu"), ("purpose", "crawl")]),
        info("crawl/a", false, 10, 0, &[]),
    ]));
    let stop = CancellationToken::new();
    let task = tokio::spawn(publish_view(directory, store.clone(), stop.clone()));
    store.hooks.published.notified().await;
    stop.cancel();
    task.await.expect("the publisher stops");
    let views = store.hooks.views.lock().unwrap().clone();
    assert_eq!(views.len(), 1, "published once before the shutdown");
    assert_eq!(
        views[0],
        vec![
            ViewEntry {
                id: "crawl/a".into(),
                healthy: false,
                latency_millis: 10,
                max_leases: 0,
                offered: true,
                indexed: vec![],
                pool: None,
            },
            ViewEntry {
                id: "crawl/b".into(),
                healthy: true,
                latency_millis: 20,
                max_leases: 3,
                offered: true,
                // The indexed keys' values only (the default: geo, tier, pool).
                indexed: vec!["geo=eu".into()],
                pool: None,
            },
        ]
    );
}
