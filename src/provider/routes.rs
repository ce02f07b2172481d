//! [`RoutedProvider`]: a node's model routes by name, and the one provider
//! the runtime is given.
//!
//! Every route has a name ([`RouteConfig::label`]): a `[[models]]` table's
//! own, or for the default route (`[provider]`, with `overseer run`'s flags
//! applied) one made from what it is (`scripted`, `openai:MODEL@URL`). A
//! session records the name of its route, and with it the route's
//! description ([`RouteConfig::describe`]), and each request is served by
//! the route its session names. A name no route has is refused with
//! [`ProviderError::UnknownRoute`], never quietly served by another route:
//! the one exception is the names the configuration's agents give for the
//! default route (`model = "scripted"` while `[provider]` is openai), which
//! sessions stored before routes had names carry.
//!
//! Routes can be added while the runtime runs ([`RoutedProvider::add`]):
//! `overseer run --resume` rebuilds the route of a session that only the
//! session remembers (one made from flags) before continuing it. This
//! module deliberately does not decide which route an agent or a session
//! uses: that is configuration's, and the caller's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use overseer_actors::provider::{Provider, ProviderError, ProviderRequest, ProviderStream};
use serde_json::Value;

use super::{build_provider_with_env, Env, ProviderConfigError, RouteConfig};

/// One built route.
struct Route {
    provider: Arc<dyn Provider>,
    description: Value,
}

/// Serves each request by the route its session names (see the module
/// documentation).
#[derive(Default)]
pub struct RoutedProvider {
    // A plain lock: held only to look a route up (or add one), never across
    // an await.
    routes: RwLock<BTreeMap<String, Arc<Route>>>,
    /// The default route's name.
    default: RwLock<Option<String>>,
    /// Other names of the default route.
    aliases: RwLock<BTreeSet<String>>,
}

impl std::fmt::Debug for RoutedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedProvider")
            .field("routes", &self.names())
            .finish()
    }
}

impl RoutedProvider {
    /// No routes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds `route` (reading its key variable from `env`) and serves it
    /// under its name, in place of any route of that name.
    pub fn add(&self, route: &RouteConfig, env: Env) -> Result<String, ProviderConfigError> {
        let provider = build_provider_with_env(route, env)?;
        let name = route.label();
        self.insert(&name, provider, route.describe());
        Ok(name)
    }

    /// Serves `provider` under `name`, described as `description`.
    pub fn insert(&self, name: &str, provider: Arc<dyn Provider>, description: Value) {
        let route = Arc::new(Route {
            provider,
            description,
        });
        self.routes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), route);
    }

    /// Makes the route named `name` the default one, also known as
    /// `aliases` (names the configuration's agents give it).
    pub fn set_default(&self, name: &str, aliases: impl IntoIterator<Item = String>) {
        *self.default.write().unwrap_or_else(|p| p.into_inner()) = Some(name.to_owned());
        self.aliases
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .extend(aliases);
    }

    /// Whether a session naming `name` is served (by that route, or by the
    /// default route under another of its names).
    pub fn serves(&self, name: &str) -> bool {
        self.route(name).is_some()
    }

    /// The names of the routes, sorted (aliases left out).
    pub fn names(&self) -> Vec<String> {
        self.routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    fn route(&self, name: &str) -> Option<Arc<Route>> {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        if let Some(route) = routes.get(name) {
            return Some(route.clone());
        }
        let aliased = self
            .aliases
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name);
        if !aliased {
            return None;
        }
        let default = self.default.read().unwrap_or_else(|p| p.into_inner());
        routes.get(default.as_deref()?).cloned()
    }

    fn unknown(&self, name: &str) -> ProviderError {
        ProviderError::UnknownRoute(format!(
            "model route '{name}' is not configured (configured: {})",
            self.names().join(", ")
        ))
    }
}

#[async_trait::async_trait]
impl Provider for RoutedProvider {
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        let route = self
            .route(&request.model)
            .ok_or_else(|| self.unknown(&request.model))?;
        route.provider.stream(request).await
    }

    fn context_window(&self, model: &str) -> Option<u64> {
        self.route(model)?.provider.context_window(model)
    }

    fn describe_route(&self, model: &str) -> Option<Value> {
        Some(self.route(model)?.description.clone())
    }
}
