//! Bounded reads of HTTP answers from channels and package indexes: a body is read only up
//! to a limit that fits what it claims to be, so an endless or huge answer ends in an error
//! (the caller names the URL) instead of filling memory. A `Content-Length` over the limit
//! is refused before a byte is read; a body that goes past it is cut off at the limit.

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the answer is {size} bytes; at most {max} are read")]
    Declared { size: u64, max: u64 },
    #[error("the answer goes on past {max} bytes, the most that are read")]
    TooLong { max: u64 },
    #[error("the answer could not be read: {0}")]
    Read(String),
}

/// The body of `response`, at most `max` bytes.
pub async fn read_bounded(mut response: reqwest::Response, max: u64) -> Result<Vec<u8>, BodyError> {
    if let Some(size) = response.content_length()
        && size > max
    {
        return Err(BodyError::Declared { size, max });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| BodyError::Read(super::error_chain(&e)))?
    {
        if body.len() as u64 + chunk.len() as u64 > max {
            return Err(BodyError::TooLong { max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
