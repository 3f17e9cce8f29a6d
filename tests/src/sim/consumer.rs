//! The simulated streams and their consumers: the source stream, and the exclusive route's
//! work queue with one consumer per partition. A consumer delivers, redelivers after its ack
//! wait, takes acks, naks (with a delay) and terms, and stops after the server's delivery
//! bound (`server_max_deliver`) with a MAX_DELIVERIES advisory, leaving the message in its
//! stream. The source consumer's settings are a value the server holds
//! ([`Streams::source_consumer`]: ack wait, delivery bound, `max_ack_pending`), as `setup`
//! wrote them and as each host's re-bind rewrites them (`route::rebind`); it hands out a message
//! only while fewer than `max_ack_pending` before it are unsettled (a message waiting for its
//! redelivery still counts). An exclusive route's consumers hand out one message at a time
//! (`max_ack_pending = 1`), so the next waits for the one before it to be acked.

use std::collections::BTreeMap;
use std::time::Duration;

use dedup_host::source_consumer::Settings;

mod history;

/// Which stream a message is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lane {
    /// The source stream.
    Source,
    /// The exclusive route's work queue.
    Queue,
}

/// Where one message is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Waiting to be delivered, not before this time.
    Available(u64),
    /// Delivered (the `number`-th time) and not settled; redelivered after `deadline`.
    Out {
        /// Which delivery this is.
        number: u64,
        /// When the ack wait runs out.
        deadline: u64,
    },
    /// The server delivered it `server_max_deliver` times and gave up: it stays in the
    /// stream, undelivered, until a host dead-letters (and deletes) it.
    Exhausted,
    /// Acked, termed, or deleted.
    Done,
}

/// One message of a stream.
#[derive(Debug, Clone)]
pub struct Message {
    /// Its stream sequence.
    pub sequence: u64,
    /// Its idempotency key (repeats model a producer's retries and replays).
    pub key: String,
    /// Its entity (exclusive routes).
    pub entity: String,
    /// Its source stream sequence (a queued copy's original).
    pub source: u64,
    /// The partition it was queued to (queued copies).
    pub partition: Option<usize>,
    /// The revision a replay reset its key at (its `Dedup-Reset-Revision`), or 0.
    pub fresh_from: u64,
    /// Where it is.
    pub delivery: Delivery,
    /// How many times it was delivered.
    pub deliveries: u64,
    /// Deleted from its stream (a queued copy dead-lettered or found settled): a new consumer
    /// does not deliver it. A source message is never deleted.
    pub deleted: bool,
}

/// A delivery the server hands to a host.
#[derive(Debug, Clone)]
pub struct Offer {
    /// The stream.
    pub lane: Lane,
    /// The message.
    pub message: Message,
    /// Which delivery this is.
    pub number: u64,
    /// The generation of the consumer that hands it out (the source consumer's changes at a
    /// rename, [`Streams::source_generation`]).
    pub consumer: u32,
}

/// The streams, their consumers, and the hosts' stranded-message markers.
#[derive(Debug)]
pub struct Streams {
    /// The source consumer's settings on the server (its filter is not modelled).
    pub source_consumer: Settings,
    /// The source stream.
    pub source: Vec<Message>,
    /// The exclusive route's work queue (empty for other routes).
    pub queue: Vec<Message>,
    /// The work queue's consumers' ack wait.
    pub ack_wait_ms: u64,
    /// The server's delivery bound (the work queue's consumers').
    pub server_max_deliver: u64,
    /// MAX_DELIVERIES advisories not handled yet.
    pub advisories: Vec<(Lane, u64)>,
    /// Stranded-message markers (`crate::stranded`): message → (not before, tries so far).
    pub markers: BTreeMap<(Lane, u64), (u64, u32)>,
    /// Streams electing a leader now: their consumers hand out nothing.
    pub leaderless: Vec<Lane>,
    /// The source consumer's generation: a rename deletes it and creates another
    /// (`history`), and what a host sends to the deleted one is lost.
    pub source_generation: u32,
    /// The sequence of the last copier epoch on the route's order subject (0: none).
    pub epoch: u64,
    /// The host the source consumer is pinned to (an exclusive route's copier), and when it
    /// last pulled.
    pub pin: Option<(usize, u64)>,
}

/// The pin id the server gives host `i` (`Nats-Pin-Id`).
pub fn pin_id(i: usize) -> String {
    format!("h{i}")
}

impl Streams {
    /// A source stream of `published` (key, entity, publish time), its consumer with
    /// `ack_wait_ms` and `server_max_deliver`, one message at a time if `exclusive` (until
    /// the hosts' `setup` writes it, `route::set_up_consumer`).
    pub fn new(
        published: &[(String, String, u64)],
        ack_wait_ms: u64,
        server_max_deliver: u64,
        exclusive: bool,
    ) -> Self {
        let mut streams = Self {
            source_consumer: Settings {
                ack_wait: Duration::from_millis(ack_wait_ms),
                max_deliver: server_max_deliver as i64,
                max_ack_pending: if exclusive { 1 } else { i64::MAX },
                filter_subjects: Vec::new(),
                pinned: false,
            },
            source: Vec::new(),
            queue: Vec::new(),
            ack_wait_ms,
            server_max_deliver,
            advisories: Vec::new(),
            markers: BTreeMap::new(),
            leaderless: Vec::new(),
            source_generation: 0,
            epoch: 0,
            pin: None,
        };
        for (key, entity, at) in published {
            streams.publish(key, entity, *at, 0);
        }
        streams
    }

    /// Appends a message to the source stream, available at `at` (`fresh_from`: see
    /// [`Message::fresh_from`]).
    pub fn publish(&mut self, key: &str, entity: &str, at: u64, fresh_from: u64) -> u64 {
        let sequence = self.source.len() as u64 + 1;
        self.source.push(Message {
            sequence,
            key: key.to_string(),
            entity: entity.to_string(),
            source: sequence,
            partition: None,
            fresh_from,
            delivery: Delivery::Available(at),
            deliveries: 0,
            deleted: false,
        });
        sequence
    }

    /// The messages of `lane`.
    pub fn lane(&self, lane: Lane) -> &[Message] {
        match lane {
            Lane::Source => &self.source,
            Lane::Queue => &self.queue,
        }
    }

    pub(super) fn lane_mut(&mut self, lane: Lane) -> &mut Vec<Message> {
        match lane {
            Lane::Source => &mut self.source,
            Lane::Queue => &mut self.queue,
        }
    }

    /// Message `sequence` of `lane`.
    pub fn message(&self, lane: Lane, sequence: u64) -> &Message {
        &self.lane(lane)[sequence as usize - 1]
    }

    /// Whether every message of both streams is settled.
    pub fn settled(&self) -> bool {
        self.source
            .iter()
            .chain(&self.queue)
            .all(|m| m.delivery == Delivery::Done)
    }

    /// The messages not settled, for the report.
    pub fn unsettled(&self) -> impl Iterator<Item = (Lane, &Message)> {
        let source = self.source.iter().map(|m| (Lane::Source, m));
        let queue = self.queue.iter().map(|m| (Lane::Queue, m));
        source
            .chain(queue)
            .filter(|(_, m)| m.delivery != Delivery::Done)
    }

    /// The earliest time something becomes deliverable or a marker comes due, if any.
    pub fn next_event(&self) -> Option<u64> {
        let available = self
            .source
            .iter()
            .chain(&self.queue)
            .filter_map(|m| match m.delivery {
                Delivery::Available(at) => Some(at),
                Delivery::Out { deadline, .. } => Some(deadline + 1),
                _ => None,
            });
        available
            .chain(self.markers.values().map(|(at, _)| *at))
            .min()
    }

    /// Hands out what the consumers deliver at `now`. Queued messages of partition `p` go out
    /// only if `pulled(p)`: some running host pulls that partition.
    /// Source messages go out only if `source_pulled`: a host may take them (the pinned one,
    /// for a consumer pinned to one host).
    pub fn due(
        &mut self,
        now: u64,
        source_pulled: bool,
        pulled: impl Fn(usize) -> bool,
    ) -> Vec<Offer> {
        let mut offers = Vec::new();
        let source = &self.source_consumer;
        let (pending, bound) = (source.max_ack_pending, source.max_deliver as u64);
        if source_pulled {
            self.offer(Lane::Source, now, |_| Some(0), pending, bound, &mut offers);
        }
        // A partition's window, never given up (`exclusive::partition_consumer`).
        let window = dedup_host::exclusive::PARTITION_WINDOW;
        self.offer(
            Lane::Queue,
            now,
            |m| m.partition,
            window,
            u64::MAX,
            &mut offers,
        );
        offers.retain(|o| o.message.partition.is_none_or(&pulled));
        offers.retain(|o| !self.leaderless.contains(&o.lane));
        for o in &offers {
            let ack_wait = match o.lane {
                Lane::Source => self.source_consumer.ack_wait.as_millis() as u64,
                Lane::Queue => self.ack_wait_ms,
            };
            let m = &mut self.lane_mut(o.lane)[o.message.sequence as usize - 1];
            m.deliveries = o.number;
            m.delivery = Delivery::Out {
                number: o.number,
                deadline: now + ack_wait,
            };
        }
        offers
    }

    /// Offers of `lane`, of which the server delivers each message up to `bound` times;
    /// `group(m)` is the message's consumer, if it has a `max_ack_pending` (`pending`): a
    /// message goes out only while fewer than `pending` of its group before it are unsettled.
    fn offer(
        &mut self,
        lane: Lane,
        now: u64,
        group: impl Fn(&Message) -> Option<usize>,
        pending: i64,
        bound: u64,
        offers: &mut Vec<Offer>,
    ) {
        let mut unsettled = BTreeMap::<usize, i64>::new();
        let mut exhausted = Vec::new();
        for m in self.lane(lane) {
            let g = group(m);
            if g.is_some_and(|g| unsettled.get(&g).is_some_and(|n| *n >= pending)) {
                continue;
            }
            match m.delivery {
                Delivery::Done | Delivery::Exhausted => continue,
                Delivery::Available(at) if at <= now && m.deliveries >= bound => {
                    exhausted.push(m.sequence);
                    continue;
                }
                Delivery::Available(at) if at <= now => offers.push(Offer {
                    lane,
                    message: m.clone(),
                    number: m.deliveries + 1,
                    consumer: match lane {
                        Lane::Source => self.source_generation,
                        Lane::Queue => 0,
                    },
                }),
                _ => {}
            }
            if let Some(g) = g {
                *unsettled.entry(g).or_default() += 1;
            }
        }
        for sequence in exhausted {
            self.lane_mut(lane)[sequence as usize - 1].delivery = Delivery::Exhausted;
            self.advisories.push((lane, sequence));
        }
    }

    /// The source consumer's ack floor (every message up to it acked or given up on, as the
    /// server moves it), the last source sequence it delivered and its pinned host's pin id.
    pub fn source_window(&self) -> dedup_delivery::copier::Window {
        let floor = (self.source.iter())
            .take_while(|m| matches!(m.delivery, Delivery::Done | Delivery::Exhausted))
            .count() as u64;
        let delivered = (self.source.iter())
            .filter(|m| m.deliveries > 0)
            .map(|m| m.sequence)
            .max()
            .unwrap_or(0);
        let pinned = self.source_consumer.pinned.then_some(self.pin).flatten();
        dedup_delivery::copier::Window {
            floor,
            delivered,
            pinned: pinned.map(|(i, _)| pin_id(i)),
        }
    }

    /// Copies source message `source` onto `partition` of the work queue; a copy of the same
    /// source message already there is dropped (its message id repeats inside the window).
    pub fn enqueue(&mut self, source: u64, partition: usize, now: u64) {
        if self.queue.iter().any(|m| m.source == source) {
            return;
        }
        let original = self.source[source as usize - 1].clone();
        self.queue.push(Message {
            sequence: self.queue.len() as u64 + 1,
            source,
            partition: Some(partition),
            delivery: Delivery::Available(now),
            deliveries: 0,
            ..original
        });
    }

    /// The newest message of the same entity queued after queued message `sequence` on the
    /// same subject, if any (what `get_last_raw_message_by_subject` tells a coalescing host).
    pub fn newest_after(&self, sequence: u64) -> Option<&Message> {
        let m = self.message(Lane::Queue, sequence);
        self.queue[sequence as usize..]
            .iter()
            .rev()
            .find(|n| n.entity == m.entity && n.partition == m.partition)
    }

    /// Settles a message a host dead-lettered, or found settled, after the server gave up on
    /// it: a queued copy is deleted from the work queue (the host deletes it); a source
    /// message stays in its stream (limits retention: the host deletes nothing there), so a
    /// new consumer starting before it delivers it again.
    pub fn delete(&mut self, lane: Lane, sequence: u64) {
        let m = &mut self.lane_mut(lane)[sequence as usize - 1];
        m.delivery = Delivery::Done;
        m.deleted = lane == Lane::Queue;
    }

    /// Messages whose ack wait ran out become available again.
    pub fn expire(&mut self, now: u64) {
        for m in self.source.iter_mut().chain(self.queue.iter_mut()) {
            if let Delivery::Out { deadline, .. } = m.delivery {
                if deadline < now {
                    m.delivery = Delivery::Available(now);
                }
            }
        }
    }
}
