//! A sequence's output text, token by token: the bytes of each token are
//! added, whole UTF-8 characters become text (a character whose bytes span
//! tokens waits for its last byte), and stop sequences end the output. Text
//! that could be the start of a stop sequence is held back until it is
//! known not to be, so a stop sequence is never sent.

/// What adding a token's bytes gave.
#[derive(Debug, PartialEq)]
pub(crate) enum Added {
    /// Text that can be sent (possibly empty).
    Text(String),
    /// A stop sequence appeared: the text before it, not yet sent.
    Stopped(String),
}

/// The generated text of one sequence and how much of it was sent.
pub(crate) struct TextOutput {
    /// Bytes of an unfinished UTF-8 character.
    partial: Vec<u8>,
    text: String,
    /// Bytes of `text` handed out.
    sent: usize,
    stops: Vec<String>,
}

impl TextOutput {
    pub(crate) fn new(stops: Vec<String>) -> Self {
        TextOutput {
            partial: Vec::new(),
            text: String::new(),
            sent: 0,
            stops: stops.into_iter().filter(|stop| !stop.is_empty()).collect(),
        }
    }

    /// Adds the bytes of one token.
    pub(crate) fn add(&mut self, bytes: &[u8]) -> Added {
        self.partial.extend_from_slice(bytes);
        self.take_whole_characters();
        if let Some(at) = self.first_stop() {
            self.text.truncate(at);
            return Added::Stopped(self.unsent(at));
        }
        let ready = self.text.len() - self.stop_prefix_len();
        Added::Text(self.unsent(ready))
    }

    /// The text not sent yet, at the end of the output (bytes of an
    /// unfinished character become U+FFFD).
    pub(crate) fn finish(&mut self) -> String {
        if !self.partial.is_empty() {
            self.text.push_str(&String::from_utf8_lossy(&self.partial));
            self.partial.clear();
        }
        self.unsent(self.text.len())
    }

    /// Moves the complete characters of `partial` into the text; invalid
    /// bytes become U+FFFD.
    fn take_whole_characters(&mut self) {
        loop {
            match std::str::from_utf8(&self.partial) {
                Ok(whole) => {
                    self.text.push_str(whole);
                    self.partial.clear();
                    return;
                }
                Err(error) => {
                    let valid = error.valid_up_to();
                    let whole = std::str::from_utf8(&self.partial[..valid]).expect("checked valid");
                    self.text.push_str(whole);
                    let Some(invalid) = error.error_len() else {
                        self.partial.drain(..valid);
                        return;
                    };
                    self.text.push(char::REPLACEMENT_CHARACTER);
                    self.partial.drain(..valid + invalid);
                }
            }
        }
    }

    /// Where the first stop sequence starts in the text, searching only
    /// where a new one can be (from the longest stop's length before the
    /// unsent text).
    fn first_stop(&self) -> Option<usize> {
        let longest = self.stops.iter().map(String::len).max()?;
        let from = self.text.floor_char_boundary(self.sent.saturating_sub(longest));
        self.stops
            .iter()
            .filter_map(|stop| self.text[from..].find(stop.as_str()).map(|at| from + at))
            .min()
    }

    /// The length of the longest end of the unsent text that begins a stop
    /// sequence.
    fn stop_prefix_len(&self) -> usize {
        let unsent = &self.text[self.sent..];
        self.stops
            .iter()
            .flat_map(|stop| (1..stop.len()).rev().map(move |n| &stop.as_bytes()[..n]))
            .filter(|prefix| unsent.as_bytes().ends_with(prefix))
            .map(<[u8]>::len)
            .max()
            .map_or(0, |n| {
                self.text.len() - self.text.floor_char_boundary(self.text.len() - n)
            })
    }

    /// The text from what was sent up to `end`, now sent.
    fn unsent(&mut self, end: usize) -> String {
        let end = end.max(self.sent);
        let piece = self.text[self.sent..end].to_string();
        self.sent = end;
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(output: &mut TextOutput, tokens: &[&[u8]]) -> Vec<Added> {
        tokens.iter().map(|bytes| output.add(bytes)).collect()
    }

    fn text(s: &str) -> Added {
        Added::Text(s.to_string())
    }

    #[test]
    fn a_character_split_across_tokens_is_sent_once_whole() {
        let mut output = TextOutput::new(vec![]);
        let e_acute = "\u{e9}".as_bytes();
        let added = texts(&mut output, &[b"caf", &e_acute[..1], &e_acute[1..], b"!"]);
        assert_eq!(added, vec![text("caf"), text(""), text("\u{e9}"), text("!")]);
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut output = TextOutput::new(vec![]);
        assert_eq!(output.add(b"a\xffb"), text("a\u{fffd}b"));
        assert_eq!(output.add(b"\xe2\x82"), text(""));
        assert_eq!(output.finish(), "\u{fffd}");
    }

    #[test]
    fn a_stop_sequence_ends_the_text_and_is_never_sent() {
        let mut output = TextOutput::new(vec!["\n\n".into(), "END".into()]);
        let added = texts(&mut output, &[b"x = 1", b"\n", b"\n", b"y"]);
        assert_eq!(added[0], text("x = 1"));
        assert_eq!(added[1], text(""), "a newline could start the stop sequence");
        assert_eq!(added[2], Added::Stopped(String::new()));
    }

    #[test]
    fn held_back_text_is_sent_once_it_cannot_start_a_stop() {
        let mut output = TextOutput::new(vec!["END".into()]);
        let added = texts(&mut output, &[b"the E", b"N", b"D"]);
        assert_eq!(added, vec![text("the "), text(""), Added::Stopped(String::new())]);
        let mut output = TextOutput::new(vec!["END".into()]);
        let added = texts(&mut output, &[b"the E", b"NOUGH"]);
        assert_eq!(added, vec![text("the "), text("ENOUGH")]);
    }

    #[test]
    fn a_stop_inside_one_token_keeps_the_text_before_it() {
        let mut output = TextOutput::new(vec!["stop".into()]);
        assert_eq!(output.add(b"go"), text("go"));
        assert_eq!(output.add(b"! stop here"), Added::Stopped("! ".into()));
    }

    #[test]
    fn finishing_sends_held_back_text() {
        let mut output = TextOutput::new(vec!["END".into()]);
        assert_eq!(output.add(b"so E"), text("so "));
        assert_eq!(output.finish(), "E");
    }
}
