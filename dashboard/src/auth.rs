//! The dashboard's token check and login: API clients send the cluster
//! token as `Authorization: Bearer TOKEN`; a browser posts it once to
//! `/login` and then carries an HttpOnly, same-site cookie (`Secure` when
//! the server speaks HTTPS). The cookie holds not the token but a value
//! derived from it ([`AuthToken::derive`]), so a stolen cookie opens the
//! dashboard and nothing else: it is no credential for gRPC, and it opens
//! only requests that read (GET, HEAD), so the routes that change the
//! cluster (Ray's job API: submit, upload, stop, delete) need the token
//! itself. Pages without the token redirect to the login page; everything
//! else is a 401.

use axum::Form;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use raylet_common::auth::AuthToken;
use raylet_common::connection_admission::prove_connection;
use serde::Deserialize;

use super::assets::LOGIN_PAGE;
use super::{Head, PUBLIC_PATHS};

/// The cookie that carries the proof of login in a browser.
const COOKIE: &str = "raylet_token";
/// What the cookie's value is derived for.
const COOKIE_LABEL: &str = "raylet dashboard login cookie v1";

/// Whether the request carries the cluster token: as a bearer token, or,
/// for a request that only reads, in the login cookie.
fn authenticated(head: &Head, method: &Method, headers: &HeaderMap) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .is_some_and(|value| head.token.admits_bearer(value.as_bytes()));
    let reads = matches!(*method, Method::GET | Method::HEAD);
    bearer
        || reads && cookie_token(headers).is_some_and(|value| head.token.admits_derived(COOKIE_LABEL, value.as_bytes()))
}

/// The value of the login cookie, if the request has one.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE).then(|| value.to_string())
        })
}

/// Lets a request for a public path or with the token through; sends a
/// browser asking for a page to the login page, and refuses anything else.
/// It wraps the whole server, so it runs before routing.
pub(super) async fn require_token(State(head): State<Head>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if authenticated(&head, request.method(), request.headers()) {
        prove_connection(request.extensions());
        return next.run(request).await;
    }
    if PUBLIC_PATHS.contains(&path) {
        return next.run(request).await;
    }
    if path == "/" || (path.starts_with("/ui") && !path.starts_with("/ui/assets/")) {
        return Redirect::to("/login").into_response();
    }
    let alternative = match request.method() {
        &Method::GET | &Method::HEAD => ", or log in at /login",
        _ => " (the login cookie opens only requests that read)",
    };
    refusal(alternative)
}

/// A 401 that says how to present the token, never showing it.
fn refusal(alternative: &str) -> Response {
    let message = format!(
        "this raylet cluster needs its token: send Authorization: Bearer <token> \
         (the token is in <temp-dir>/session_latest/token){alternative}\n"
    );
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        message,
    )
        .into_response()
}

/// The login form.
pub(super) async fn login_page() -> Html<String> {
    Html(LOGIN_PAGE.replace("{{error}}", ""))
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    token: String,
}

/// Checks a posted token: a right one sets the cookie and goes on to the
/// overview, a wrong one shows the form again with a message.
pub(super) async fn log_in(State(head): State<Head>, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.trim();
    if !head.token.matches(token.as_bytes()) {
        let page = LOGIN_PAGE.replace(
            "{{error}}",
            r#"<p class="error" id="login-error">That is not this cluster's token.</p>"#,
        );
        return (StatusCode::UNAUTHORIZED, Html(page)).into_response();
    }
    let https = matches!(raylet_common::tls::current(), Ok(Some(_)));
    let cookie = login_cookie(&head.token, https);
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/")).into_response()
}

/// The `Set-Cookie` value of a login: the value derived from the token,
/// never the token, and `Secure` over HTTPS.
fn login_cookie(token: &AuthToken, https: bool) -> String {
    let value = token.derive(COOKIE_LABEL);
    let secure = if https { "; Secure" } else { "" };
    format!("{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/{secure}")
}

/// Lets a request with `Authorization: Bearer <token>` through (a node's
/// `/metrics`, which has no pages and no login).
pub(super) async fn require_bearer(State(token): State<AuthToken>, request: Request, next: Next) -> Response {
    let bearer = request.headers().get(header::AUTHORIZATION);
    match bearer.is_some_and(|value| token.admits_bearer(value.as_bytes())) {
        true => {
            prove_connection(request.extensions());
            next.run(request).await
        }
        false => refusal(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_login_cookie_holds_no_token_and_is_secure_over_https() {
        let token = AuthToken::generate();
        for https in [false, true] {
            let cookie = login_cookie(&token, https);
            assert!(!cookie.contains(token.expose()), "{cookie}");
            assert!(cookie.contains("HttpOnly; SameSite=Strict"), "{cookie}");
            assert_eq!(cookie.contains("; Secure"), https, "{cookie}");
            let value = cookie.split(';').next().unwrap().strip_prefix("raylet_token=").unwrap();
            assert!(token.admits_derived(COOKIE_LABEL, value.as_bytes()));
            assert!(!token.matches(value.as_bytes()), "the cookie is no gRPC credential");
        }
    }
}
