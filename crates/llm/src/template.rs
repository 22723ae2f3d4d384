//! The chat template: `tokenizer.chat_template` (Jinja) rendered with `minijinja`.
//!
//! The environment is the one Hugging Face `transformers` renders chat templates in:
//! `trim_blocks` and `lstrip_blocks` on, loop controls, `raise_exception(msg)`, Python's string
//! methods (`.strip()`, `.startswith()`, ... through minijinja-contrib's pycompat), and the
//! variables `messages` (a list of `{role, content}`), `add_generation_prompt`, `bos_token`,
//! `eos_token`. The template comes from the file, so its work is bounded (minijinja's fuel):
//! a template that loops without end fails with an error instead of hanging.

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, ErrorKind, Value, context};

use crate::Error;
use crate::gguf::Gguf;
use crate::tokenizer::Tokenizer;

/// The metadata key of the template.
pub const KEY: &str = "tokenizer.chat_template";
/// Template instructions one rendering may execute.
pub const FUEL: u64 = 10_000_000;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's source.
    pub source: String,
    bos_token: String,
    eos_token: String,
}

fn environment() -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| Error::Template(format!("{e:#}")))?;
    env.set_syntax(syntax);
    env.set_fuel(Some(FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    Ok(env)
}

impl ChatTemplate {
    /// Compiles a template; `bos_token`/`eos_token` are the texts the template may insert.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, Error> {
        let mut env = environment()?;
        let source = source.into();
        env.add_template_owned("chat", source.clone())
            .map_err(|e| Error::Template(format!("{e:#}")))?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The file's template (`None` when it has none), with its BOS/EOS texts.
    pub fn from_gguf(g: &Gguf, tokenizer: &Tokenizer) -> Result<Option<ChatTemplate>, Error> {
        let Some(v) = g.get(KEY) else {
            return Ok(None);
        };
        let source = v.as_str().ok_or_else(|| Error::Metadata {
            key: KEY.into(),
            why: format!("a {}, expected a string", v.describe()),
        })?;
        let text = |id: Option<u32>| {
            id.and_then(|id| tokenizer.token_bytes(id))
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        ChatTemplate::new(source, text(tokenizer.bos), text(tokenizer.eos)).map(Some)
    }

    /// Renders a conversation; `add_generation_prompt` ends it with the assistant's turn
    /// opened.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let t = self
            .env
            .get_template("chat")
            .map_err(|e| Error::Template(format!("{e:#}")))?;
        t.render(context! {
            messages => Value::from(
                messages
                    .iter()
                    .map(|m| Value::from_pairs([
                        ("role", m.role.as_str()),
                        ("content", m.content.as_str()),
                    ]))
                    .collect::<Vec<_>>()
            ),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| Error::Template(format!("{e:#}")))
    }
}
