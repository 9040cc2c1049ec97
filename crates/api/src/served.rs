//! The namespaces an install serves (`--proxy-namespace`), and one watch over all of them.
//!
//! kube's reflector replaces its whole store at every re-list (`Init` .. `InitDone`), so the
//! watchers of several namespaces cannot simply be merged into one store: each namespace's
//! re-list would drop every other namespace's objects (kube-state-metrics met the same with
//! client-go's reflectors). [`watch`] merges them into a stream that reads as one watcher of the
//! union: a namespace's re-list is held until it is complete, then the union is given as one
//! re-list; changes pass through as they come.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::core::NamespaceResourceScope;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// At most this many namespaces are named.
pub const MAX_NAMESPACES: usize = 32;

/// Which namespaces: every one, or those named.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Namespaces {
    /// Every namespace of the cluster (`*`); the default, for tests and tools that serve
    /// everything they are shown (the operator's flags default to its own namespace).
    #[default]
    All,
    /// Only these.
    Only(BTreeSet<String>),
}

impl Namespaces {
    /// One namespace.
    pub fn one(namespace: &str) -> Self {
        Self::Only([namespace.to_owned()].into())
    }

    /// Whether `namespace` is one of them.
    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(names) => names.contains(namespace),
        }
    }

    /// The names; `None` for every namespace.
    pub fn names(&self) -> Option<&BTreeSet<String>> {
        match self {
            Self::All => None,
            Self::Only(names) => Some(names),
        }
    }
}

impl fmt::Display for Namespaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("every namespace"),
            Self::Only(names) => {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                f.write_str(&names.join(", "))
            }
        }
    }
}

/// A watch of the `K`s in `namespaces`, each namespace's watcher with kube's default backoff,
/// reading as one watcher of them all (see the module's comment). `trim` is applied to every
/// object as it arrives, before anything keeps it (to drop fields nothing reads).
pub fn watch<K>(
    client: Client,
    namespaces: &Namespaces,
    config: watcher::Config,
    trim: fn(&mut K),
) -> BoxStream<'static, watcher::Result<Event<K>>>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let names = match namespaces {
        Namespaces::All => {
            return watcher(Api::<K>::all(client), config)
                .default_backoff()
                .modify(trim)
                .boxed();
        }
        Namespaces::Only(names) if names.len() == 1 => {
            let api = Api::<K>::namespaced(client, names.first().map_or("", String::as_str));
            return watcher(api, config).default_backoff().modify(trim).boxed();
        }
        Namespaces::Only(names) => names.clone(),
    };
    let each: Vec<_> = names
        .iter()
        .map(|namespace| {
            let tag = namespace.clone();
            watcher(Api::<K>::namespaced(client.clone(), namespace), config.clone())
                .default_backoff()
                .modify(trim)
                .map(move |event| (tag.clone(), event))
                .boxed()
        })
        .collect();
    let mut union = Union::new(names);
    futures::stream::select_all(each)
        .flat_map(move |(namespace, event)| {
            let out: Vec<watcher::Result<Event<K>>> = match event {
                Ok(event) => union.take(&namespace, event).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            futures::stream::iter(out)
        })
        .boxed()
}

/// The objects of several namespaces' watchers, kept to give their union at every re-list.
#[derive(Debug)]
struct Union<K> {
    /// Each namespace's objects by name; `None` until its first list is complete.
    listed: BTreeMap<String, Option<BTreeMap<String, K>>>,
    /// The re-lists under way: what each has brought so far.
    relisting: BTreeMap<String, BTreeMap<String, K>>,
}

impl<K: Resource + Clone> Union<K> {
    fn new(namespaces: BTreeSet<String>) -> Self {
        Self {
            listed: namespaces.into_iter().map(|n| (n, None)).collect(),
            relisting: BTreeMap::new(),
        }
    }

    /// What one namespace's `event` means for the union's watcher.
    fn take(&mut self, namespace: &str, event: Event<K>) -> Vec<Event<K>> {
        let objects = self.listed.get_mut(namespace).and_then(Option::as_mut);
        match event {
            Event::Apply(object) => {
                if let Some(objects) = objects {
                    objects.insert(object.name_any(), object.clone());
                }
                vec![Event::Apply(object)]
            }
            Event::Delete(object) => {
                if let Some(objects) = objects {
                    objects.remove(&object.name_any());
                }
                vec![Event::Delete(object)]
            }
            Event::Init => {
                self.relisting.insert(namespace.to_owned(), BTreeMap::new());
                Vec::new()
            }
            Event::InitApply(object) => {
                self.relisting
                    .entry(namespace.to_owned())
                    .or_default()
                    .insert(object.name_any(), object);
                Vec::new()
            }
            Event::InitDone => {
                let objects = self.relisting.remove(namespace).unwrap_or_default();
                self.listed.insert(namespace.to_owned(), Some(objects));
                self.relist()
            }
        }
    }

    /// The union as one re-list, once every namespace has been listed (nothing before: a
    /// store would otherwise read as complete without them).
    fn relist(&self) -> Vec<Event<K>> {
        let mut out = vec![Event::Init];
        for objects in self.listed.values() {
            let Some(objects) = objects else {
                return Vec::new();
            };
            out.extend(objects.values().cloned().map(Event::InitApply));
        }
        out.push(Event::InitDone);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;

    fn object(namespace: &str, name: &str) -> ConfigMap {
        let mut o = ConfigMap::default();
        o.metadata.namespace = Some(namespace.into());
        o.metadata.name = Some(name.into());
        o
    }

    /// Runs `events` through a union of `a` and `b` into a reflector store; the names it holds.
    fn stored(events: Vec<(&str, Event<ConfigMap>)>) -> Vec<String> {
        let (reader, mut writer) = reflector::store::<ConfigMap>();
        let mut union = Union::new(["a".to_owned(), "b".to_owned()].into());
        for (namespace, event) in events {
            for out in union.take(namespace, event) {
                writer.apply_watcher_event(&out);
            }
        }
        let mut names: Vec<String> = reader
            .state()
            .iter()
            .map(|o| format!("{}/{}", o.namespace().unwrap(), o.name_any()))
            .collect();
        names.sort();
        names
    }

    fn listed(namespace: &'static str, names: &[&str]) -> Vec<(&'static str, Event<ConfigMap>)> {
        let mut out = vec![(namespace, Event::Init)];
        out.extend(
            names
                .iter()
                .map(|n| (namespace, Event::InitApply(object(namespace, n)))),
        );
        out.push((namespace, Event::InitDone));
        out
    }

    #[test]
    fn nothing_is_given_as_listed_until_every_namespace_is() {
        let mut union = Union::new(["a".to_owned(), "b".to_owned()].into());
        let mut out = Vec::new();
        for (namespace, event) in listed("a", &["x"]) {
            out.extend(union.take(namespace, event));
        }
        assert!(out.is_empty(), "{out:?}");
        for (namespace, event) in listed("b", &["y"]) {
            out.extend(union.take(namespace, event));
        }
        let shape: Vec<String> = out
            .iter()
            .map(|e| match e {
                Event::Init => "Init".to_owned(),
                Event::InitApply(o) => format!("InitApply {}/{}", o.namespace().unwrap(), o.name_any()),
                Event::InitDone => "InitDone".to_owned(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(shape, ["Init", "InitApply a/x", "InitApply b/y", "InitDone"]);
    }

    #[test]
    fn a_namespace_relisted_keeps_the_others_in_the_store() {
        let mut events = listed("a", &["x"]);
        events.extend(listed("b", &["y"]));
        events.push(("a", Event::Apply(object("a", "w"))));
        events.push(("b", Event::Apply(object("b", "v"))));
        events.push(("b", Event::Delete(object("b", "y"))));
        // `a` is listed again (its watch expired): x is gone meanwhile, z is new.
        events.extend(listed("a", &["w", "z"]));
        assert_eq!(stored(events), ["a/w", "a/z", "b/v"]);
    }

    #[test]
    fn changes_pass_through_during_another_namespaces_relist() {
        let mut events = listed("a", &["x"]);
        events.extend(listed("b", &["y"]));
        events.push(("a", Event::Init));
        events.push(("a", Event::InitApply(object("a", "x"))));
        events.push(("b", Event::Apply(object("b", "u"))));
        assert_eq!(
            stored(events.clone()),
            ["a/x", "b/u", "b/y"],
            "b's change is in at once"
        );
        events.push(("a", Event::InitDone));
        assert_eq!(stored(events), ["a/x", "b/u", "b/y"]);
    }

    #[test]
    fn the_names_are_shown_in_order() {
        let names = Namespaces::Only(["b".to_owned(), "a".to_owned()].into());
        assert_eq!(names.to_string(), "a, b");
        assert!(names.contains("a") && !names.contains("c"));
        assert!(Namespaces::All.contains("c"));
        assert_eq!(Namespaces::one("a").names().unwrap().len(), 1);
    }
}
