//! A headless Chromium driven over the Chrome DevTools Protocol, for the
//! dashboard's browser test: open pages, run script in them, collect every
//! script error and console error, take screenshots.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// The Chromium binary Debian's package installs.
pub fn chromium_path() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|name| {
        Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

/// A running headless Chromium with one page, attached in flat mode.
pub struct Browser {
    process: Child,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    /// Script exceptions and console or log errors, as text.
    pub errors: Vec<String>,
}

impl Browser {
    /// Starts Chromium with a fresh profile in `profile` and opens a page.
    pub fn start(binary: &str, profile: &Path) -> Browser {
        let mut process = Command::new(binary)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
                "--window-size=1400,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts");
        let stderr = BufReader::new(process.stderr.take().unwrap());
        let mut endpoint = None;
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(url) = line.split("DevTools listening on ").nth(1) {
                endpoint = Some(url.trim().to_string());
                break;
            }
        }
        let endpoint = endpoint.expect("chromium printed its DevTools endpoint");
        let (socket, _) = tungstenite::connect(endpoint.as_str()).expect("the DevTools socket opens");
        let mut browser = Browser {
            process,
            socket,
            session: String::new(),
            next_id: 1,
            errors: Vec::new(),
        };
        let target = browser.call("Target.createTarget", json!({"url": "about:blank"}));
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_string();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.call(domain, json!({}));
        }
        browser
    }

    /// Sends a command (to the page once attached) and returns its result;
    /// events that arrive meanwhile are checked for errors.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut command = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            command["sessionId"] = json!(self.session);
        }
        self.socket.send(Message::text(command.to_string())).unwrap();
        loop {
            let message = self.socket.read().expect("the DevTools socket stays open");
            let Ok(text) = message.to_text() else { continue };
            let Ok(message) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            if message["id"] == id {
                assert!(message.get("error").is_none(), "{method} failed: {message}");
                return message["result"].clone();
            }
            self.note_event(&message);
        }
    }

    fn note_event(&mut self, event: &Value) {
        let params = &event["params"];
        match event["method"].as_str() {
            Some("Runtime.exceptionThrown") => self.errors.push(format!("exception: {}", params["exceptionDetails"])),
            Some("Runtime.consoleAPICalled") if params["type"] == "error" => {
                self.errors.push(format!("console.error: {}", params["args"]))
            }
            Some("Log.entryAdded") if params["entry"]["level"] == "error" => {
                self.errors.push(format!("log: {}", params["entry"]["text"]))
            }
            _ => {}
        }
    }

    /// The value of a script expression in the page.
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(result.get("exceptionDetails").is_none(), "{expression}: {result}");
        result["result"]["value"].clone()
    }

    /// Loads `url`.
    pub fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Waits until `expression` is true in the page (one that throws, as
    /// while the page loads, is not).
    pub fn wait_for(&mut self, expression: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let check = format!("(() => {{ try {{ return Boolean({expression}); }} catch (e) {{ return false; }} }})()");
        while self.eval(&check) != json!(true) {
            let body = self.eval("document.body ? document.body.innerText.slice(0, 2000) : ''");
            assert!(
                Instant::now() < deadline,
                "{what} never happened; the page shows: {body}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Writes a PNG of the page to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
