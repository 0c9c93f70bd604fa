import { z } from "zod";
import { TEMPLATE_NAME_RE } from "./api.ts";

/** Conversation and turn ids are chosen by clients: 1-128 of letters, digits and `_ . : -`. */
export const CLIENT_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
const clientId = z
  .string()
  .regex(CLIENT_ID_RE, "1 to 128 letters, digits and _ . : -, starting with a letter or digit");

/** `POST /conversations`: all optional; the sandbox is made on the first tool call. */
export const createConversationRequest = z
  .object({
    conversation_id: clientId.optional(),
    template: z.string().regex(TEMPLATE_NAME_RE, "a template name such as workspace").optional(),
    vcpu: z.number().int().positive().optional(),
    memory_mib: z.number().int().positive().optional(),
    /**
     * Work in this existing sandbox of the caller's tenant (made with its own policy and secrets)
     * instead of one the tools make on first use; deleting the conversation deletes it.
     */
    sandbox_id: z
      .string()
      .regex(/^sbx_[a-z2-7]{20}$/, "a sandbox id (sbx_ and 20 letters and digits)")
      .optional(),
  })
  .strict();

/** `POST /conversations/{id}/turns`: begins a turn (ending the open one). */
export const beginTurnRequest = z.object({ turn_id: clientId.optional() }).strict();

/** `POST /corpus?name=sales.csv`, the document's bytes as the body. */
export const corpusUploadQuery = z
  .object({
    name: z
      .string()
      .min(1)
      .max(255)
      .regex(/^[^/\0]+$/, "a file name without /"),
  })
  .strict();
