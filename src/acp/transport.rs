//! The newline-delimited transport on this process's stdin and stdout, on
//! tokio's own stdio (no extra threads or crates): one JSON-RPC message per
//! line, each line flushed as it is written.

use agent_client_protocol::Lines;
use futures::{Sink, Stream};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_stream::wrappers::LinesStream;

/// Lines in from stdin, lines out to stdout.
pub(crate) fn stdio() -> Lines<
    impl Sink<String, Error = std::io::Error> + Send + 'static,
    impl Stream<Item = std::io::Result<String>> + Send + 'static,
> {
    let incoming = LinesStream::new(BufReader::new(tokio::io::stdin()).lines());
    let outgoing = Box::pin(futures::sink::unfold(
        tokio::io::stdout(),
        |mut out, line: String| async move {
            let mut bytes = line.into_bytes();
            bytes.push(b'\n');
            out.write_all(&bytes).await?;
            out.flush().await?;
            Ok::<_, std::io::Error>(out)
        },
    ));
    Lines::new(outgoing, incoming)
}
