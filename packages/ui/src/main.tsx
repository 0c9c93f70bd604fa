import { render } from "preact";
import "./styles.css";
import { App } from "./app.tsx";

render(<App />, document.getElementById("app")!);
