// Copyright 2020-2022 The NATS Authors
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

use std::fmt::Display;

use serde::{Deserialize, Serialize};

impl std::error::Error for Error {}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: String,
    pub code: usize,
}

impl Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "service request error code: {}, status: {}",
            self.code, self.status
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn display_prints_code_then_status() {
        let err = Error {
            status: "Testing".to_string(),
            code: 101,
        };
        assert_eq!(
            err.to_string(),
            "service request error code: 101, status: Testing"
        );
    }
}
