/**
 * One metered quantity (vCPU hours, GiB hours) over this month, per tenant, added up day by day,
 * with each tenant's monthly budget as a dashed line of the same colour: where a line crosses its
 * dashes, that tenant went over. Drawn by uPlot, which is loaded with this chart only. The canvas
 * is an image to assistive technology; the table beside it on the usage page holds the numbers.
 */
import { useEffect, useRef } from "preact/hooks";

export interface ChartLine {
  owner: string;
  /** Running total at the end of each day of `days`. */
  cumulative: number[];
  budget: number | null;
}

/** Distinct at 3:1 against white and to each other for the common kinds of colour blindness (Okabe-Ito). */
const COLOURS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000"];

export function colourOf(i: number): string {
  return COLOURS[i % COLOURS.length]!;
}

export function UsageChart(props: { title: string; unit: string; days: number[]; lines: ChartLine[] }) {
  const box = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const el = box.current;
    if (!el) return;
    let chart: { destroy(): void; setSize(s: { width: number; height: number }): void } | undefined;
    let gone = false;
    const size = (): { width: number; height: number } => ({ width: Math.max(240, el.clientWidth), height: 220 });
    void Promise.all([import("uplot"), import("uplot/dist/uPlot.min.css")]).then(([{ default: uPlot }]) => {
      if (gone) return;
      const series = props.lines.flatMap((l, i) => [
        { label: l.owner, stroke: colourOf(i), width: 2 },
        ...(l.budget === null ? [] : [{ label: `${l.owner} budget`, stroke: colourOf(i), dash: [6, 4], width: 1 }]),
      ]);
      const data = [
        props.days,
        ...props.lines.flatMap((l) => [l.cumulative, ...(l.budget === null ? [] : [props.days.map(() => l.budget)])]),
      ];
      chart = new uPlot(
        {
          ...size(),
          tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
          series: [{}, ...series],
          // One tick a day at most, named by its UTC date: the points are days' running totals, not hours.
          axes: [
            { incrs: [86_400], values: (_u, ticks) => ticks.map((t) => new Date(t * 1000).toISOString().slice(5, 10)) },
            { label: props.unit, size: 60 },
          ],
          scales: { y: { range: (_u, _min, max) => [0, Math.max(max, 1) * 1.1] } },
          legend: { live: false },
          cursor: { show: false },
        },
        data as ConstructorParameters<typeof uPlot>[1],
        el,
      );
    });
    const onResize = (): void => chart?.setSize(size());
    addEventListener("resize", onResize);
    return () => {
      gone = true;
      removeEventListener("resize", onResize);
      chart?.destroy();
    };
  }, [props.days, props.lines, props.unit]);
  return (
    <figure class="chart">
      <figcaption>{props.title}</figcaption>
      <div
        ref={box}
        role="img"
        aria-label={`${props.title}: ${props.lines
          .map((l) => `${l.owner} ${(l.cumulative.at(-1) ?? 0).toFixed(2)} of ${l.budget ?? "no"} budget`)
          .join("; ")}`}
      />
    </figure>
  );
}
