//! The node's monotonic clock (see the `node` module doc, "Two clocks").

use crate::time::Millis;

/// The node's monotonic clock. When the shell feeds a real monotonic reading
/// ([`Node::observe_monotonic`]) it advances by exactly that, so wall-clock steps either way
/// change nothing; without one it follows the wall clock forward and ignores steps back.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MonoClock {
    pub(super) last_wall: Option<Millis>,
    mono: Millis,
    /// The last external monotonic reading, once the shell provides them.
    external: Option<Millis>,
}

impl MonoClock {
    pub(super) fn observe_external(&mut self, ext: Millis) {
        if let Some(prev) = self.external {
            self.mono = self.mono.plus(ext.since(prev));
        }
        self.external = Some(ext);
    }

    pub(super) fn advance(&mut self, wall: Millis) -> Millis {
        if self.external.is_some() {
            if self.last_wall.is_none() {
                self.mono = wall; // the origin: any non-zero instant will do
            }
            self.last_wall = Some(wall);
            return self.mono;
        }
        match self.last_wall {
            None => self.mono = wall,
            Some(prev) => self.mono = self.mono.plus(wall.since(prev)),
        }
        self.last_wall = Some(wall);
        self.mono
    }

    pub(super) fn peek(&self, wall: Millis) -> Millis {
        if self.external.is_some() && self.last_wall.is_some() {
            return self.mono;
        }
        match self.last_wall {
            None => wall,
            Some(prev) => self.mono.plus(wall.since(prev)),
        }
    }

    /// The wall time at which monotonic time `m` will be reached.
    pub(super) fn to_wall(self, m: Millis) -> Millis {
        match self.last_wall {
            None => m,
            Some(wall) => wall.plus(m.since(self.mono)),
        }
    }
}
