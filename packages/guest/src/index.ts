export { Channel } from "./channel.ts";
