//! The serving engine on the tiny llama: requests submitted from many threads at once give
//! what each gives alone, their deltas add up to their text, a client that leaves frees its
//! slot, a full queue and a draining engine refuse at once, stop strings never leak, and the
//! metrics count what happened.

#[path = "common/tiny_dir.rs"]
mod tiny_dir;

use nrt_llm::engine::{Engine, EngineOptions, Event, Request, SubmitError};
use nrt_llm::generate::{FinishReason, GenerateParams, Generation, generate};
use nrt_llm::runner::{Runner, Sampling};
use std::sync::mpsc;
use std::time::Duration;
use tiny_dir::{PROMPTS, built, options, runtime};

/// A request whose events arrive on a channel.
fn request(prompt: &[u32], params: GenerateParams) -> (Request, mpsc::Receiver<Event>) {
    let (tx, rx) = mpsc::channel();
    let r = Request {
        prompt: prompt.to_vec(),
        params,
        sink: Box::new(move |e| tx.send(e).is_ok()),
    };
    (r, rx)
}

/// Waits for a request's end: its deltas' text and tokens, and the final event.
fn collect(rx: &mpsc::Receiver<Event>) -> (String, Vec<u32>, Generation) {
    let (mut text, mut tokens) = (String::new(), Vec::new());
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).expect("an event") {
            Event::Delta(d) => {
                text.push_str(&d.text);
                tokens.extend(d.token_ids);
            }
            Event::Finished(g) => return (text, tokens, g),
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
}

/// A prompt of `n` tokens of the tiny vocabulary.
fn long_prompt(n: u32) -> Vec<u32> {
    (0..n).map(|k| 3 + (k * 37) % 250).collect()
}

fn params(max_tokens: usize, seed: u64, temperature: f32) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: Sampling {
            temperature,
            top_p: 0.9,
            seed,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn concurrent_requests_give_what_each_gives_alone() {
    let (_, dir) = built("engine-alone", &options());
    let rt = runtime();
    // Every fifth prompt is longer than the largest context bucket (16): it prefills in
    // chunks while the others decode.
    let requests: Vec<(Vec<u32>, GenerateParams)> = (0..10)
        .map(|i| {
            let p = if i % 5 == 4 {
                long_prompt(27)
            } else {
                PROMPTS[i % 3].to_vec()
            };
            let t = if i % 2 == 0 { 0.0 } else { 20.0 };
            (p, params(3 + i, i as u64, t))
        })
        .collect();
    let alone: Vec<Generation> = {
        let mut r = Runner::load(&rt, &dir, 0).unwrap();
        requests
            .iter()
            .map(|(p, q)| generate(&mut r, 0, p, q, &mut |_| {}).unwrap())
            .collect()
    };
    let engine = Engine::start(
        Runner::load(&rt, &dir, 0).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    assert_eq!(engine.limits().width, 4, "min(batch bucket 4, slots)");
    // Submitted from ten threads at once.
    let got: Vec<(String, Vec<u32>, Generation)> = std::thread::scope(|s| {
        let hs: Vec<_> = requests
            .iter()
            .map(|(p, q)| {
                let e = &engine;
                s.spawn(move || {
                    let (r, rx) = request(p, q.clone());
                    e.submit(r).unwrap();
                    collect(&rx)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, ((text, tokens, g), a)) in got.iter().zip(&alone).enumerate() {
        assert_eq!(g.token_ids, a.token_ids, "request {i}");
        assert_eq!(g.finish_reason, a.finish_reason, "request {i}");
        assert_eq!(&g.text, text, "request {i}: the deltas add up to the text");
        assert_eq!(
            &g.token_ids, tokens,
            "request {i}: the deltas carry every token"
        );
        assert_eq!(g.logprobs.len(), g.token_ids.len());
    }
    // The gauges are set at the step's end, just after the last client heard its end.
    let t0 = std::time::Instant::now();
    while engine.metrics().running > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let m = engine.metrics();
    assert_eq!(m.finished.iter().sum::<u64>(), 10);
    assert_eq!(m.prefills, 10);
    assert!(m.decodes > 0 && m.running == 0 && m.waiting == 0);
    let generated: u64 = got.iter().map(|g| g.2.token_ids.len() as u64).sum();
    assert_eq!(m.generation_tokens, generated);
    assert_eq!(m.ttft.count(), 10);
    assert_eq!(m.e2e.count(), 10);
    assert_eq!(engine.in_flight(), 0);
}

#[test]
fn a_client_that_leaves_frees_its_slot() {
    let (_, dir) = built("engine-cancel", &options());
    let rt = runtime();
    let opts = EngineOptions {
        max_num_seqs: 1,
        ..Default::default()
    };
    let engine = Engine::start(Runner::load(&rt, &dir, 0).unwrap(), opts).unwrap();
    // The first client hangs up after its first delta: the one slot must come back.
    let (tx, rx) = mpsc::channel();
    let mut heard = 0;
    let leaving = Request {
        prompt: PROMPTS[0].to_vec(),
        params: params(30, 0, 0.0),
        sink: Box::new(move |e| {
            heard += 1;
            let _ = tx.send(e);
            heard < 2
        }),
    };
    engine.submit(leaving).unwrap();
    let mut last = None;
    while let Ok(e) = rx.recv_timeout(Duration::from_secs(60)) {
        last = Some(e);
    }
    match last {
        Some(Event::Finished(g)) => assert_eq!(g.finish_reason, FinishReason::Abort),
        other => panic!("the leaving request ends aborted, got {other:?}"),
    }
    // The next one runs in the freed slot.
    let (r, rx) = request(PROMPTS[1], params(4, 0, 0.0));
    engine.submit(r).unwrap();
    let (_, _, g) = collect(&rx);
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(g.token_ids.len(), 4);
    // Cancelled by id while it runs.
    let (r, rx) = request(PROMPTS[2], params(30, 0, 0.0));
    let id = engine.submit(r).unwrap();
    engine.cancel(id);
    let (_, _, g) = collect(&rx);
    assert!(g.token_ids.len() < 30);
    assert_eq!(g.finish_reason, FinishReason::Abort);
    let m = engine.metrics();
    assert_eq!(m.finished, [0, 1, 2]);
    assert_eq!(engine.in_flight(), 0);
}

#[test]
fn a_full_queue_and_a_draining_engine_refuse_at_once() {
    let (_, dir) = built("engine-queue", &options());
    let rt = runtime();
    let opts = EngineOptions {
        max_num_seqs: 1,
        max_queue: 3,
        ..Default::default()
    };
    let engine = Engine::start(Runner::load(&rt, &dir, 0).unwrap(), opts).unwrap();
    // The first request's sink holds the engine thread until the gate opens: everything
    // submitted meanwhile waits in the queue.
    let (gate_tx, gate) = mpsc::channel::<()>();
    let (held_tx, held) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    let mut first = true;
    let blocker = Request {
        prompt: PROMPTS[0].to_vec(),
        params: params(2, 0, 0.0),
        sink: Box::new(move |e| {
            if first && matches!(e, Event::Delta(_)) {
                first = false;
                let _ = held_tx.send(());
                let _ = gate.recv_timeout(Duration::from_secs(60));
            }
            let _ = done_tx.send(e);
            true
        }),
    };
    engine.submit(blocker).unwrap();
    held.recv_timeout(Duration::from_secs(60)).unwrap();
    let mut queued = Vec::new();
    for i in 0..3 {
        let (r, rx) = request(PROMPTS[i % 3], params(2, 0, 0.0));
        engine.submit(r).unwrap();
        queued.push(rx);
    }
    let (r, _) = request(PROMPTS[0], params(2, 0, 0.0));
    assert_eq!(engine.submit(r), Err(SubmitError::QueueFull { waiting: 3 }));
    // Bad requests are refused before the queue, naming the culprit.
    let (r, _) = request(&[], params(2, 0, 0.0));
    assert!(matches!(engine.submit(r), Err(SubmitError::Invalid(w)) if w.contains("0 tokens")));
    let (r, _) = request(PROMPTS[0], params(2, 0, -1.0));
    assert!(matches!(engine.submit(r), Err(SubmitError::Invalid(w)) if w.contains("temperature")));
    let (r, _) = request(&[7; 32], params(2, 0, 0.0));
    assert!(
        matches!(engine.submit(r), Err(SubmitError::Invalid(w)) if w.contains("max model length 32"))
    );
    let (r, _) = request(PROMPTS[0], params(0, 0, 0.0));
    assert!(matches!(engine.submit(r), Err(SubmitError::Invalid(w)) if w.contains("max_tokens")));
    // Draining: refused, while what was queued still runs to its end.
    engine.drain();
    let (r, _) = request(PROMPTS[0], params(2, 0, 0.0));
    assert_eq!(engine.submit(r), Err(SubmitError::Draining));
    gate_tx.send(()).unwrap();
    while let Ok(e) = done.recv_timeout(Duration::from_secs(60)) {
        if matches!(e, Event::Finished(_)) {
            break;
        }
    }
    for rx in &queued {
        let (_, _, g) = collect(rx);
        assert_eq!(g.token_ids.len(), 2);
    }
    assert_eq!(engine.metrics().rejected, 1);
    assert_eq!(
        engine.shutdown(Duration::from_secs(10)),
        0,
        "nothing left to cancel"
    );
}

#[test]
fn stop_strings_end_the_text_and_never_leak_into_the_stream() {
    let (_, dir) = built("engine-stop", &options());
    let rt = runtime();
    let engine = Engine::start(
        Runner::load(&rt, &dir, 0).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    let (r, rx) = request(PROMPTS[1], params(20, 0, 0.0));
    engine.submit(r).unwrap();
    let (_, _, full) = collect(&rx);
    let chars: Vec<char> = full.text.chars().collect();
    assert!(
        chars.len() >= 6,
        "the tiny model writes text: {:?}",
        full.text
    );
    // A stop string from the middle of the text, spanning tokens.
    let at = chars.len() / 2;
    let stop: String = chars[at - 1..at + 2].iter().collect();
    let want = &full.text[..full.text.find(&stop).unwrap()];
    let mut p = params(20, 0, 0.0);
    p.stop = vec!["never there".into(), stop.clone()];
    let (r, rx) = request(PROMPTS[1], p);
    engine.submit(r).unwrap();
    let (streamed, _, g) = collect(&rx);
    assert_eq!(g.text, want, "stop {stop:?}");
    assert_eq!(
        streamed, want,
        "the stream shows no part of the stop string"
    );
    assert_eq!(g.finish_reason, FinishReason::Stop);
}

#[test]
fn a_device_fault_fails_the_requests_it_carried_and_the_next_ones_run() {
    let (_, dir) = built("engine-fault", &options());
    let dev = std::sync::Arc::new(nrt_sim::SoftDevice::new(nrt_sim::SimConfig::default()).unwrap());
    let rt =
        nrt_runtime::Runtime::init(dev.clone(), nrt_runtime::RuntimeConfig::default()).unwrap();
    let engine = Engine::start(
        Runner::load(&rt, &dir, 0).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    // Two requests decoding together; the core wedges (fatal) in a decode step: request a's
    // sink holds the engine at its second token (a decode step's) until the fault is armed,
    // so the next execution the device takes is the next decode step.
    let (b, rb) = request(PROMPTS[1], params(25, 0, 0.0));
    let (gate_tx, gate) = mpsc::channel::<()>();
    let (held_tx, held) = mpsc::channel();
    let (a_tx, ra) = mpsc::channel();
    let mut deltas = 0;
    let a = Request {
        prompt: PROMPTS[0].to_vec(),
        params: params(25, 0, 0.0),
        sink: Box::new(move |e| {
            if matches!(e, Event::Delta(_)) {
                deltas += 1;
                if deltas == 2 {
                    let _ = held_tx.send(());
                    let _ = gate.recv_timeout(Duration::from_secs(60));
                }
            }
            a_tx.send(e).is_ok()
        }),
    };
    engine.submit(b).unwrap();
    engine.submit(a).unwrap();
    held.recv_timeout(Duration::from_secs(60)).unwrap();
    dev.inject(nrt_sim::FaultSpec::new(nrt_sim::FaultKind::Fatal))
        .unwrap();
    gate_tx.send(()).unwrap();
    let failed = |rx: &mpsc::Receiver<Event>| loop {
        match rx.recv_timeout(Duration::from_secs(60)).expect("an event") {
            Event::Delta(_) => {}
            Event::Finished(g) => return Err(g.finish_reason),
            Event::Failed(e) => return Ok(e),
        }
    };
    let (ea, eb) = (failed(&ra), failed(&rb));
    let ea = ea.expect("request a was in the faulted step");
    assert!(
        ea.contains("executing decode-"),
        "the error says what failed: {ea}"
    );
    if let Ok(eb) = eb {
        assert_eq!(eb, ea, "b was in the same step");
    }
    // The core was reset: the next requests run.
    let (c, rc) = request(PROMPTS[1], params(5, 0, 0.0));
    engine.submit(c).unwrap();
    let (_, _, g) = collect(&rc);
    assert_eq!(g.token_ids.len(), 5);
    let m = engine.metrics();
    assert!(m.failed >= 1 && m.resets >= 1, "{m:?}");
}
