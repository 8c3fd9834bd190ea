//! The dashboard's pages, compiled into the binary: one HTML shell for
//! every page, its script and style, and the login form. Nothing is loaded
//! from elsewhere, so the dashboard works without a network.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

pub(super) const LOGIN_PAGE: &str = include_str!("assets/login.html");
const SHELL: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// The pages under `/ui/`; the empty one is the overview.
const PAGES: [&str; 8] = [
    "",
    "jobs",
    "actors",
    "tasks",
    "placement-groups",
    "objects",
    "train",
    "serve",
];

/// A page: the shell, whose script draws the page its path names.
pub(super) async fn page(page: Option<Path<String>>) -> Response {
    let name = page.map(|Path(name)| name).unwrap_or_default();
    match PAGES.contains(&name.as_str()) {
        true => Html(SHELL).into_response(),
        false => (StatusCode::NOT_FOUND, format!("the dashboard has no page {name:?}\n")).into_response(),
    }
}

pub(super) async fn script() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT).into_response()
}

pub(super) async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}
