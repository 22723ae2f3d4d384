//! `nrt top`: the terminal UI of `neuron-top` over the records the runtimes publish in the
//! runtime directory (the same ones `nrt ls` and `nrt monitor` read): per-core utilization,
//! each process's execution rates and errors, memory by category, and the models it has
//! loaded, refreshed every period. `q` (or Esc, Ctrl-C) quits; Tab / arrow keys pick the
//! process whose memory and models are shown.

use crate::args::TopArgs;
use crate::session::Res;
use nrt_runtime::host::{
    self, ERROR_CLASS_NAMES, MEM_NAMES, ProcessRecord, VcoreSnapshot, fmt_bytes,
};
use nrt_sim::HostShape;
use ratatui::Frame;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Direction, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, Wrap};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// One process as shown: its record and what changed over the last period.
#[derive(Clone, Debug)]
pub struct ProcView {
    /// The record as read.
    pub rec: ProcessRecord,
    /// Executions finished per second (any outcome).
    pub exec_rate: f64,
    /// Executions that failed per second.
    pub err_rate: f64,
    /// Utilization (0–100) of each physical core it holds, by global id.
    pub util: Vec<(u32, f64)>,
}

/// Everything one frame shows.
#[derive(Clone, Debug)]
pub struct View {
    /// The virtual host.
    pub shape: HostShape,
    /// Where the records are.
    pub dir: PathBuf,
    /// The live runtimes, by pid.
    pub procs: Vec<ProcView>,
    /// The process whose memory and models are shown.
    pub selected: usize,
    /// Seconds between refreshes.
    pub period: f64,
    /// Files named like records that were not used, and why (shown under the processes).
    pub skipped: Vec<(String, String)>,
}

/// Turns successive reads of the records into rates.
#[derive(Default)]
struct Sampler {
    prev: HashMap<(u32, u64), (Instant, ProcessRecord)>,
}

impl Sampler {
    fn sample(&mut self, recs: Vec<ProcessRecord>) -> Vec<ProcView> {
        let now = Instant::now();
        let mut next = HashMap::new();
        let views = recs
            .into_iter()
            .map(|r| {
                let key = (r.pid, r.start_unix_ns);
                let done = |r: &ProcessRecord| -> (u64, u64, Vec<u64>) {
                    let all = r.vcores.iter().map(|v| v.status.iter().sum::<u64>()).sum();
                    let err = r
                        .vcores
                        .iter()
                        .map(|v| v.status.iter().skip(1).sum::<u64>())
                        .sum();
                    (all, err, r.vcores.iter().map(|v| v.busy_ns).collect())
                };
                let (all, err, busy) = done(&r);
                let (exec_rate, err_rate, busy_d, dt) = match self.prev.get(&key) {
                    Some((t, p)) => {
                        let dt = now.duration_since(*t).as_secs_f64().max(1e-3);
                        let (pa, pe, pb) = done(p);
                        (
                            all.saturating_sub(pa) as f64 / dt,
                            err.saturating_sub(pe) as f64 / dt,
                            busy.iter()
                                .zip(pb.iter().chain(std::iter::repeat(&0)))
                                .map(|(a, b)| a.saturating_sub(*b))
                                .collect::<Vec<_>>(),
                            dt,
                        )
                    }
                    None => (0.0, 0.0, vec![0; busy.len()], 1.0),
                };
                let mut util = Vec::new();
                for (v, b) in r.vcores.iter().zip(&busy_d) {
                    let pct = (100.0 * *b as f64 * 1e-9 / dt).clamp(0.0, 100.0);
                    for c in v.first_core..v.first_core + v.cores.max(1) {
                        util.push((c, pct));
                    }
                }
                next.insert(key, (now, r.clone()));
                ProcView {
                    rec: r,
                    exec_rate,
                    err_rate,
                    util,
                }
            })
            .collect();
        self.prev = next;
        views
    }
}

fn tag_of(r: &ProcessRecord) -> String {
    if r.tag.is_empty() {
        r.pid.to_string()
    } else {
        r.tag.clone()
    }
}

fn bar(pct: f64, width: usize) -> String {
    let full = ((pct / 100.0) * width as f64).round() as usize;
    let full = full.min(width);
    format!("{}{}", "█".repeat(full), "·".repeat(width - full))
}

fn total_latency_p(r: &ProcessRecord, p: f64) -> String {
    let mut h = vec![0u64; host::HIST_BUCKETS];
    for v in &r.vcores {
        for (a, b) in h.iter_mut().zip(&v.lat_total) {
            *a += b;
        }
    }
    match host::percentile(&h, p) {
        Some(ns) if ns >= 1e6 => format!("{:.2} ms", ns / 1e6),
        Some(ns) => format!("{:.1} µs", ns / 1e3),
        None => "-".into(),
    }
}

/// Draws one frame.
pub fn draw(f: &mut Frame, v: &View) {
    let cores = v.shape.devices * v.shape.cores_per_device;
    let core_rows = (cores as u16).min(16);
    let proc_rows = (v.procs.len() as u16).clamp(1, 10);
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Length(core_rows + 3),
            Constraint::Length(proc_rows + 3),
            Constraint::Min(6),
        ])
        .split(f.area());

    let title = Line::from(vec![
        Span::styled("nrt top", Style::default().add_modifier(Modifier::BOLD)),
        Span::raw(format!(
            " · {} ({} device(s) × {} NeuronCores, {} each) · {} runtime(s) · every {:.1} s · q quits, Tab picks a process",
            v.shape.instance_type,
            v.shape.devices,
            v.shape.cores_per_device,
            fmt_bytes(v.shape.device_memory),
            v.procs.len(),
            v.period
        )),
    ]);
    f.render_widget(Paragraph::new(title), rows[0]);

    // NeuronCores: utilization, owner and models of each (the first 16).
    let mut owner: HashMap<u32, (&ProcView, f64)> = HashMap::new();
    for p in &v.procs {
        for &(c, u) in &p.util {
            owner.insert(c, (p, u));
        }
    }
    let core_table: Vec<Row> = (0..cores.min(16))
        .map(|c| match owner.get(&c) {
            Some((p, u)) => {
                let mine = |vc: &&VcoreSnapshot| {
                    (vc.first_core..vc.first_core + vc.cores.max(1)).contains(&c)
                };
                let mut models: Vec<String> = p
                    .rec
                    .vcores
                    .iter()
                    .enumerate()
                    .filter(|(_, vc)| mine(vc))
                    .flat_map(|(i, _)| {
                        p.rec
                            .models
                            .iter()
                            .filter(move |m| m.vnc as usize == i)
                            .map(|m| m.name.clone())
                    })
                    .collect();
                // A lockstep group that the device serves from one thread (its parts could
                // not run in parallel on this host).
                if p.rec
                    .vcores
                    .iter()
                    .any(|vc| mine(&vc) && vc.cores > 1 && vc.lockstep_serving & 1 != 0)
                {
                    models.push("[joint]".into());
                }
                Row::new(vec![
                    Cell::from(format!("core {c}")),
                    Cell::from(bar(*u, 20)).style(Style::default().fg(Color::Green)),
                    Cell::from(format!("{u:5.1}%")),
                    Cell::from(format!("pid {}", p.rec.pid)),
                    Cell::from(models.join(", ")),
                ])
            }
            None => Row::new(vec![
                Cell::from(format!("core {c}")),
                Cell::from(bar(0.0, 20)),
                Cell::from("    -"),
                Cell::from("free"),
                Cell::from(""),
            ]),
        })
        .collect();
    let more = if cores > 16 {
        format!(" (first 16 of {cores})")
    } else {
        String::new()
    };
    f.render_widget(
        Table::new(
            core_table,
            [
                Constraint::Length(9),
                Constraint::Length(21),
                Constraint::Length(7),
                Constraint::Length(11),
                Constraint::Min(10),
            ],
        )
        .header(
            Row::new(vec!["CORE", "UTILIZATION", "", "OWNER", "MODELS"])
                .style(Style::default().add_modifier(Modifier::BOLD)),
        )
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!("NeuronCores{more}")),
        ),
        rows[1],
    );

    // Processes: rates, totals, latency, memory.
    let proc_table: Vec<Row> = v
        .procs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let r = &p.rec;
            let done: u64 = r.vcores.iter().map(|x| x.status.iter().sum::<u64>()).sum();
            let errs: u64 = r.vcores.iter().map(|x| x.errors.iter().sum::<u64>()).sum();
            let dev: u64 = r
                .vcores
                .iter()
                .map(|x| x.mem[..5].iter().sum::<u64>())
                .sum();
            let hostm: u64 = r
                .vcores
                .iter()
                .map(|x| x.mem[host::mem::HOST_TENSORS])
                .sum();
            let cores: Vec<String> = r.cores.iter().map(u32::to_string).collect();
            let style = if i == v.selected {
                Style::default().add_modifier(Modifier::REVERSED)
            } else {
                Style::default()
            };
            Row::new(vec![
                Cell::from(r.pid.to_string()),
                Cell::from(tag_of(r)),
                Cell::from(cores.join(",")),
                Cell::from(format!("{:.1}", p.exec_rate)),
                Cell::from(format!("{:.1}", p.err_rate)),
                Cell::from(done.to_string()),
                Cell::from(errs.to_string()),
                Cell::from(total_latency_p(r, 50.0)),
                Cell::from(total_latency_p(r, 99.0)),
                Cell::from(fmt_bytes(dev)),
                Cell::from(fmt_bytes(hostm)),
                Cell::from(r.cmdline.clone()),
            ])
            .style(style)
        })
        .collect();
    let proc_block = Block::default()
        .borders(Borders::ALL)
        .title(format!("Processes (runtime directory {})", v.dir.display()))
        .title_bottom(match v.skipped.first() {
            None => String::new(),
            Some((name, why)) => format!(
                " skipped {} file(s) named like records: {name}: {why} ",
                v.skipped.len()
            ),
        });
    if v.procs.is_empty() {
        f.render_widget(
            Paragraph::new("no runtime is running (processes publish here when they init)")
                .block(proc_block),
            rows[2],
        );
    } else {
        f.render_widget(
            Table::new(
                proc_table,
                [
                    Constraint::Length(8),
                    Constraint::Length(8),
                    Constraint::Length(7),
                    Constraint::Length(9),
                    Constraint::Length(7),
                    Constraint::Length(9),
                    Constraint::Length(7),
                    Constraint::Length(9),
                    Constraint::Length(9),
                    Constraint::Length(10),
                    Constraint::Length(10),
                    Constraint::Min(10),
                ],
            )
            .header(
                Row::new(vec![
                    "PID", "TAG", "CORES", "EXEC/S", "ERR/S", "DONE", "ERRORS", "P50", "P99",
                    "DEVICE", "HOST", "COMMAND",
                ])
                .style(Style::default().add_modifier(Modifier::BOLD)),
            )
            .block(proc_block),
            rows[2],
        );
    }

    // The selected process: memory by category, errors by class, models per logical core.
    let bottom = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(50), Constraint::Percentage(50)])
        .split(rows[3]);
    let Some(p) = v.procs.get(v.selected) else {
        return;
    };
    let r = &p.rec;
    let mut mem_rows: Vec<Row> = Vec::new();
    for (k, name) in MEM_NAMES.iter().enumerate() {
        let total: u64 = r.vcores.iter().map(|x| x.mem[k]).sum();
        let mut cells = vec![
            Cell::from(name.replace('_', " ")),
            Cell::from(fmt_bytes(total)),
        ];
        for x in r.vcores.iter().take(4) {
            cells.push(Cell::from(fmt_bytes(x.mem[k])));
        }
        mem_rows.push(Row::new(cells));
    }
    let mut header = vec!["MEMORY".to_owned(), "TOTAL".to_owned()];
    for (i, x) in r.vcores.iter().enumerate().take(4) {
        header.push(format!("vnc {i} (nc {})", x.first_core));
    }
    let mut widths = vec![Constraint::Length(13), Constraint::Length(11)];
    widths.extend(r.vcores.iter().take(4).map(|_| Constraint::Length(13)));
    f.render_widget(
        Table::new(mem_rows, widths)
            .header(Row::new(header).style(Style::default().add_modifier(Modifier::BOLD)))
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(format!("Memory of pid {}", r.pid)),
            ),
        bottom[0],
    );

    let mut lines: Vec<Line> = Vec::new();
    let errs: Vec<String> = ERROR_CLASS_NAMES
        .iter()
        .enumerate()
        .map(|(k, n)| format!("{n} {}", r.vcores.iter().map(|x| x.errors[k]).sum::<u64>()))
        .collect();
    lines.push(Line::from(format!("errors: {}", errs.join(", "))));
    for (i, x) in r.vcores.iter().enumerate() {
        let cores: Vec<String> = (x.first_core..x.first_core + x.cores.max(1))
            .map(|c| c.to_string())
            .collect();
        lines.push(Line::from(Span::styled(
            format!(
                "vnc {i} (core {}): {} model(s), {} executions",
                cores.join("+"),
                x.models,
                x.status.iter().sum::<u64>()
            ),
            Style::default().add_modifier(Modifier::BOLD),
        )));
        for m in r.models.iter().filter(|m| m.vnc as usize == i) {
            lines.push(Line::from(format!(
                "  └ {} (id {})  {}",
                m.name,
                m.id,
                fmt_bytes(m.mem.iter().sum())
            )));
        }
    }
    f.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(
            Block::default().borders(Borders::ALL).title(format!(
                "Models of pid {} ({})",
                r.pid,
                tag_of(r)
            )),
        ),
        bottom[1],
    );
}

/// `nrt top`.
pub fn main(a: &TopArgs) -> Res<()> {
    if !(0.05..=3600.0).contains(&a.period) {
        return Err(format!(
            "--period {} is out of range (0.05 to 3600 s)",
            a.period
        ));
    }
    if !std::io::stdout().is_terminal() {
        return Err(
            "needs a terminal (stdout is not one); `nrt monitor` writes the same figures as JSON lines"
                .into(),
        );
    }
    let shape = HostShape::from_env().map_err(|e| e.to_string())?;
    let dir = host::runtime_dir_from_env();
    let mut term = ratatui::try_init().map_err(|e| format!("cannot set up the terminal: {e}"))?;
    let res = run(&mut term, shape, dir, Duration::from_secs_f64(a.period));
    ratatui::restore();
    res
}

fn run(
    term: &mut ratatui::DefaultTerminal,
    shape: HostShape,
    dir: PathBuf,
    period: Duration,
) -> Res<()> {
    let mut sampler = Sampler::default();
    let mut view = View {
        shape,
        procs: Vec::new(),
        dir,
        selected: 0,
        period: period.as_secs_f64(),
        skipped: Vec::new(),
    };
    loop {
        let scan = host::scan_records(&view.dir);
        view.skipped = scan.skipped;
        view.procs = sampler.sample(scan.records.into_iter().map(|(_, r)| r).collect());
        view.selected = view.selected.min(view.procs.len().saturating_sub(1));
        term.draw(|f| draw(f, &view)).map_err(|e| e.to_string())?;
        let next = Instant::now() + period;
        loop {
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() || !event::poll(left).map_err(|e| e.to_string())? {
                break;
            }
            let ev = event::read().map_err(|e| e.to_string())?;
            match ev {
                Event::Key(k) if k.kind != KeyEventKind::Release => match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(());
                    }
                    KeyCode::Tab | KeyCode::Right | KeyCode::Down => {
                        if !view.procs.is_empty() {
                            view.selected = (view.selected + 1) % view.procs.len();
                        }
                        term.draw(|f| draw(f, &view)).map_err(|e| e.to_string())?;
                    }
                    KeyCode::BackTab | KeyCode::Left | KeyCode::Up => {
                        if !view.procs.is_empty() {
                            view.selected =
                                (view.selected + view.procs.len() - 1) % view.procs.len();
                        }
                        term.draw(|f| draw(f, &view)).map_err(|e| e.to_string())?;
                    }
                    _ => {}
                },
                Event::Resize(..) => {
                    term.draw(|f| draw(f, &view)).map_err(|e| e.to_string())?;
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nrt_runtime::host::ModelSnapshot;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn screen(v: &View, w: u16, h: u16) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| draw(f, v)).unwrap();
        let buf = t.backend().buffer().clone();
        let mut s = String::new();
        for y in 0..h {
            for x in 0..w {
                s.push_str(buf[(x, y)].symbol());
            }
            s.push('\n');
        }
        s
    }

    #[test]
    fn a_frame_shows_cores_processes_memory_and_models() {
        let mut status = [0u64; 6];
        status[0] = 90;
        status[2] = 10;
        let mut errors = [0u64; 6];
        errors[1] = 10;
        let mut mem = [0u64; 6];
        mem[host::mem::CONSTANTS] = 3 << 20;
        mem[host::mem::HOST_TENSORS] = 4096;
        let rec = ProcessRecord {
            pid: 4321,
            start_unix_ns: 1,
            cmdline: "python serve.py".into(),
            tag: "serve".into(),
            models: vec![ModelSnapshot {
                id: 7,
                vnc: 0,
                name: "resnet50".into(),
                mem: [0, 3 << 20, 4096, 0, 0],
            }],
            cores: vec![1],
            holding: true,
            lnc: 1,
            vcores: vec![VcoreSnapshot {
                first_core: 1,
                cores: 1,
                status,
                errors,
                busy_ns: 0,
                models: 1,
                mem,
                lat_total: vec![0; host::HIST_BUCKETS],
                lat_device: vec![0; host::HIST_BUCKETS],
                lockstep_serving: 0,
            }],
        };
        let v = View {
            shape: HostShape::default(),
            dir: "/tmp/nrt".into(),
            procs: vec![ProcView {
                rec,
                exec_rate: 12.5,
                err_rate: 0.5,
                util: vec![(1, 50.0)],
            }],
            selected: 0,
            period: 1.0,
            skipped: Vec::new(),
        };
        let s = screen(&v, 160, 40);
        let line = |needle: &str| {
            s.lines()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no line with {needle:?} in\n{s}"))
                .to_owned()
        };
        // Core 1 is held by the process, half busy, running its model; core 0 is free.
        let c1 = line("core 1 ");
        assert!(
            c1.contains("50.0%") && c1.contains("pid 4321") && c1.contains("resnet50"),
            "{c1}"
        );
        assert!(c1.contains(&"█".repeat(10)), "{c1}");
        assert!(line("core 0 ").contains("free"));
        // The process row: tag, core, rates, totals, host memory, command.
        let p = line("python serve.py");
        for want in ["4321", "serve", "12.5", "0.5", "100", "10", "4.00 KiB"] {
            assert!(p.contains(want), "{want:?} in {p}");
        }
        // Memory by category and the model tree of the selected process.
        assert!(line("constants").contains("3.00 MiB"), "{s}");
        assert!(line("host tensors").contains("4.00 KiB"), "{s}");
        assert!(line("errors:").contains("numerical 10"), "{s}");
        assert!(line("└ resnet50 (id 7)").contains("3.00 MiB"), "{s}");
    }

    #[test]
    fn a_lockstep_group_served_from_one_thread_says_so() {
        for joint in [true, false] {
            let rec = crate::hostview::tests::record(2, (3 << 1) | u64::from(joint));
            let v = View {
                shape: HostShape::default(),
                dir: "/tmp/nrt".into(),
                procs: vec![ProcView {
                    rec,
                    exec_rate: 0.0,
                    err_rate: 0.0,
                    util: vec![(0, 90.0), (1, 90.0)],
                }],
                selected: 0,
                period: 1.0,
                skipped: Vec::new(),
            };
            let s = screen(&v, 160, 40);
            for core in ["core 0 ", "core 1 "] {
                let l = s.lines().find(|l| l.contains(core)).expect(core);
                assert!(l.contains("encoder"), "{l}");
                assert_eq!(l.contains("[joint]"), joint, "{l}");
            }
        }
    }

    #[test]
    fn bars_fill_with_the_percentage() {
        assert_eq!(bar(0.0, 4), "····");
        assert_eq!(bar(50.0, 4), "██··");
        assert_eq!(bar(100.0, 4), "████");
        assert_eq!(bar(250.0, 4), "████");
    }
}
